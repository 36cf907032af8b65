package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
)

// ensureProvisioned checks, on every heartbeat (messages.WorkerTTL/3), that what the
// worker needs still exists, and provisions everything again when something
// is missing: a nats-server restarted on the same store loses the
// memory-storage buckets (the heartbeats in messages.BucketWorkers, coordination's
// presence in coordination.BucketPeers), and one restarted on an empty store
// loses everything. Without this, every later run's coordination would be
// unavailable and the reconciler would take every worker for dead. It
// returns an error only when NATS cannot answer; the next heartbeat tries
// again.
func (w *Worker) ensureProvisioned(ctx context.Context) error {
	missing, err := w.missingResource(ctx)
	if err != nil || missing == "" {
		return err
	}
	w.log.Warn().Str("missing", missing).Msg("a JetStream resource the worker needs is gone (nats-server restarted?); provisioning again")
	if _, err := Provision(ctx, w.js, w.cfg.Provision); err != nil {
		return fmt.Errorf("re-provision: %w", err)
	}
	if err := coordination.Provision(ctx, w.js, w.cfg.Provision.Replicas); err != nil {
		return fmt.Errorf("re-provision: %w", err)
	}
	return nil
}

// missingResource names the first resource the worker needs that the server
// says does not exist, or returns "" when all do. It asks three questions a
// heartbeat: the two memory-storage buckets (lost by any restart) and the
// pool's consumer (lost, with its stream, when the store is), since any one
// missing provisions everything again.
func (w *Worker) missingResource(ctx context.Context) (string, error) {
	for _, b := range []string{messages.BucketWorkers, coordination.BucketPeers} {
		_, err := w.js.KeyValue(ctx, b)
		switch {
		case errors.Is(err, jetstream.ErrBucketNotFound):
			return "bucket " + b, nil
		case err != nil:
			return "", fmt.Errorf("look up bucket %s: %w", b, err)
		}
	}
	name := messages.ConsumerName(w.cfg.Provision.Pool)
	_, err := w.js.Consumer(ctx, messages.StreamRuns, name)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return "consumer " + name, nil
	case err != nil:
		return "", fmt.Errorf("look up consumer %s: %w", name, err)
	}
	return "", nil
}
