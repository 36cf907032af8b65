package main

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/worker"
)

func (a workerCmds) workerCmd() *cobra.Command {
	var (
		o   workerOptions
		url string
	)
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run a worker against a NATS server",
		Long: `worker connects to a NATS server with JetStream, creates jetcrew's streams,
bucket and the pool's consumer if they are missing, and runs the requests of
its pool in Docker containers until it is stopped.

SIGUSR2 stops it for an upgrade: its runs in flight go on in their containers,
and the next worker started on the same engine adopts them, their agents never
restarted. Interrupt (Ctrl-C) or SIGTERM stops it: runs in flight get --drain-timeout to
finish (a second interrupt cuts that short), after which they are stopped and
handed back to the stream for another worker.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runWorker(cmd.Context(), a.natsURL(url), o)
		},
	}
	natsFlag(cmd, &url)
	o.addFlags(cmd.Flags())
	o.addPoolFlags(cmd.Flags())
	o.addReplicasFlag(cmd.Flags())
	return cmd
}

func (a workerCmds) runWorker(ctx context.Context, url string, o workerOptions) error {
	profiles, err := o.check()
	if err != nil {
		return err
	}
	nc, err := a.connect(url, "jetcrew worker", nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	return a.serveWorker(ctx, nc, o, profiles, func(w *worker.Worker) {
		a.log.Info().Str("nats", redactURL(nc.ConnectedUrl())).Str("worker", w.ID()).Msg("worker ready")
	}, nil)
}
