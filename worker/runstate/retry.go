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
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 5 * time.Second
	b.MaxElapsedTime = OpMaxElapsed
	err := backoff.Retry(func() error {
		actx, cancel := context.WithTimeout(ctx, OpAttemptTimeout)
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
