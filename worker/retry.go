package worker

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
	opAttemptTimeout = 5 * time.Second
	opMaxElapsed     = 2 * time.Minute
)

// provisionAttemptTimeout bounds one try of creating a stream, bucket or
// consumer: on a new R3 cluster one can take longer than the JetStream API's
// 5 second default. A try cut short is harmless (the server goes on, and the
// next try of the same configuration succeeds), while a long one stalls a
// worker whose request was lost to a node restart.
const provisionAttemptTimeout = 10 * time.Second

// retryProvision is retryOp for provisioning calls: 10 seconds a try, for up
// to 3 minutes; each failed try is told to ctx's provisionNotify.
func retryProvision(ctx context.Context, op func(ctx context.Context) error) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 500 * time.Millisecond
	b.MaxInterval = 10 * time.Second
	b.MaxElapsedTime = 3 * time.Minute
	return backoff.RetryNotify(func() error {
		actx, cancel := context.WithTimeout(ctx, provisionAttemptTimeout)
		defer cancel()
		err := op(actx)
		if err != nil && ctx.Err() != nil {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(b, ctx), provisionNotify(ctx))
}

// retryOp runs op until it succeeds, returns an error wrapped with
// backoff.Permanent (returned unwrapped), ctx ends, or opMaxElapsed passes.
// Each try gets its own context of at most opAttemptTimeout. It returns the
// last error.
func retryOp(ctx context.Context, op func(ctx context.Context) error) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 5 * time.Second
	b.MaxElapsedTime = opMaxElapsed
	err := backoff.Retry(func() error {
		actx, cancel := context.WithTimeout(ctx, opAttemptTimeout)
		defer cancel()
		err := op(actx)
		if err != nil && ctx.Err() != nil {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(b, ctx))
	var perm *backoff.PermanentError
	if errors.As(err, &perm) {
		return perm.Err
	}
	return err
}
