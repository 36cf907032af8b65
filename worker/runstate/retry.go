package runstate

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Bounds of retried NATS operations (state writes, events, acks, dead
// letters). A request whose reply is lost, as when the server it went to
// dies, otherwise waits for its whole context; here each try has its own
// short timeout and the operation is tried again with backoff.
const (
	// OpAttemptTimeout bounds one try: 5 seconds.
	OpAttemptTimeout = 5 * time.Second
	// OpMaxElapsed bounds all the tries of one operation: 2 minutes.
	OpMaxElapsed = 2 * time.Minute
)

// RetryOp runs op until it succeeds, returns an error wrapped with
// backoff.Permanent (returned unwrapped), ctx ends, or OpMaxElapsed passes.
// Each try gets its own context of at most OpAttemptTimeout. It returns the
// last error.
func RetryOp(ctx context.Context, op func(ctx context.Context) error) error {
	// The first try needs no backoff: most succeed.
	start := time.Now()
	err := try(ctx, op)
	var perm *backoff.PermanentError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &perm):
		return perm.Err
	}
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 5 * time.Second
	// The next try waits as backoff's own second try would.
	t := time.NewTimer(b.InitialInterval)
	select {
	case <-ctx.Done():
		t.Stop()
		return err
	case <-t.C:
	}
	b.MaxElapsedTime = OpMaxElapsed - time.Since(start)
	if b.MaxElapsedTime <= 0 {
		return err
	}
	err = backoff.Retry(func() error { return try(ctx, op) }, backoff.WithContext(b, ctx))
	if errors.As(err, &perm) {
		return perm.Err
	}
	return err
}

// try is one try of op, in a context of at most OpAttemptTimeout; an error
// once ctx has ended is permanent.
func try(ctx context.Context, op func(ctx context.Context) error) error {
	actx, cancel := context.WithTimeout(ctx, OpAttemptTimeout)
	defer cancel()
	err := op(actx)
	if err != nil && ctx.Err() != nil {
		return backoff.Permanent(err)
	}
	return err
}
