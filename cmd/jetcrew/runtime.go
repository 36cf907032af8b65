package main

import (
	"context"

	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/worker/docker"
	"github.com/jetcrew/jetcrew/worker/jail"
)

// newDockerRuntime connects to the Docker engine named by the environment
// (DOCKER_HOST, else the default socket) and returns it as the worker's
// runtime, with the function that closes it.
func newDockerRuntime(ctx context.Context, log zerolog.Logger) (jail.Runtime, func() error, error) {
	rt, err := docker.New(ctx, docker.Config{Logger: log.With().Str("component", "docker").Logger()})
	if err != nil {
		return nil, nil, err
	}
	return rt, rt.Close, nil
}
