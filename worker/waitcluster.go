package worker

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A worker that starts before its NATS cluster can serve JetStream (a fresh
// cluster electing its meta leader, a node catching up) waits for it instead
// of exiting: every provisioning step is tried until it
// succeeds or the worker is stopped, and every failed try is logged with what
// the worker waits for and when it tries again. An error waiting cannot cure
// (clusterNotReady) still fails Start at once.

// clusterWaitMax is the longest pause between two provisioning tries while
// the worker waits for its cluster.
const clusterWaitMax = 5 * time.Second

// probeTimeout bounds the JetStream account-info request that tells whether
// the cluster answers JetStream requests at all.
const probeTimeout = 2 * time.Second

type provisionNotifyKey struct{}

// withProvisionNotify returns ctx carrying fn, which retryProvision calls
// after each failed try with the error and the pause before the next.
func withProvisionNotify(ctx context.Context, fn func(err error, next time.Duration)) context.Context {
	return context.WithValue(ctx, provisionNotifyKey{}, fn)
}

// provisionNotify is the function withProvisionNotify put in ctx, or one
// that does nothing.
func provisionNotify(ctx context.Context) backoff.Notify {
	if fn, ok := ctx.Value(provisionNotifyKey{}).(func(error, time.Duration)); ok {
		return fn
	}
	return func(error, time.Duration) {}
}

// untilProvisioned runs step (what names it in the log) until it succeeds or
// ctx ends, logging each failure as a wait for the cluster. It returns nil
// once step succeeded, the first error that is not the cluster's being not
// ready (clusterNotReady), or ctx's error.
func (w *Worker) untilProvisioned(ctx context.Context, what string, step func(ctx context.Context) error) error {
	start := time.Now()
	tries := 0
	notify := func(err error, next time.Duration) {
		tries++
		w.log.Warn().Err(err).Str("waiting_for", what).Int("try", tries).Dur("next_in", next).
			Dur("waited", time.Since(start).Round(time.Millisecond)).Msg("waiting for the NATS cluster to serve JetStream")
	}
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 500 * time.Millisecond
	b.MaxInterval = clusterWaitMax
	b.MaxElapsedTime = 0 // until ctx ends
	err := backoff.RetryNotify(func() error {
		// A cluster without a meta leader does not answer at all: a short
		// probe finds that out in seconds rather than a provisioning
		// try's 30.
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		_, err := w.js.AccountInfo(pctx)
		cancel()
		if err == nil {
			err = step(withProvisionNotify(ctx, notify))
		}
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return backoff.Permanent(ctx.Err())
		case !clusterNotReady(err):
			return backoff.Permanent(err) // a broken setup: fail at once
		}
		return err
	}, backoff.WithContext(b, ctx), notify)
	if err == nil && tries > 0 {
		w.log.Info().Str("step", what).Dur("waited", time.Since(start).Round(time.Millisecond)).Msg("NATS cluster ready")
	}
	return err
}

// JetStream API error codes of a cluster that cannot serve yet: no peers
// for placement (nodes still joining), system temporarily unavailable (no
// meta leader), not the leader, stream offline.
var notReadyCodes = []jetstream.ErrorCode{10005, 10008, 10009, 10118}

// clusterNotReady reports whether err says the NATS cluster cannot serve
// JetStream yet, which waiting cures: a timeout, no responders, a
// disconnection, or one of notReadyCodes. Anything else (JetStream disabled,
// a permission, a conflicting configuration) is a broken setup.
func clusterNotReady(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected) || errors.Is(err, jetstream.ErrNoHeartbeat) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		for _, c := range notReadyCodes {
			if apiErr.ErrorCode == c {
				return true
			}
		}
	}
	return false
}
