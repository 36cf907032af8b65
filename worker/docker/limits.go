package docker

import "github.com/docker/docker/api/types/container"

// RunNofile is the open-file limit (RLIMIT_NOFILE, soft and hard) of every
// process in a run container. Each process of a run can hold at most this
// many descriptors, connections to its bridge socket included; the worker
// bounds its own side separately (coordination.MaxConnsPerSession). 1024 is
// the usual Linux default soft limit: enough for an agent CLI, far below
// the engine's default of about a million.
const RunNofile = 1024

// runLogConfig is the log configuration of every run container: driver
// "none", so the engine keeps none of the run's output on disk. The worker
// reads output through attach, which works with any driver, and publishes it
// itself (docs/jail.md); `docker logs` of a run container shows nothing.
func runLogConfig() container.LogConfig {
	return container.LogConfig{Type: "none"}
}

// runUlimits returns the resource limits set on every run container.
func runUlimits() []*container.Ulimit {
	return []*container.Ulimit{{Name: "nofile", Soft: RunNofile, Hard: RunNofile}}
}
