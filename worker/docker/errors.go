package docker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/client"
	"github.com/jetcrew/jetcrew/worker/jail"
)

// ErrNameInUse is wrapped by the error Start returns when a container with
// spec.Name already exists (the Engine answers 409 Conflict): the delivery
// it names already has a container. The error also still satisfies
// errdefs.IsConflict from github.com/containerd/errdefs. It does not wrap
// jail.ErrPermanent: the existing container is the reconciler's to judge.
var ErrNameInUse = errors.New("container name already in use")

// imageNotFound is the error of a spec whose image the engine does not
// have: its text is the wrapped error's, and it matches jail.ErrImageNotFound
// as well as what it wraps (jail.ErrPermanent).
type imageNotFound struct{ error }

func (e imageNotFound) Unwrap() error        { return e.error }
func (e imageNotFound) Is(target error) bool { return target == jail.ErrImageNotFound }

// classify wraps err, returned by the daemon for the call op, with what it
// means for the caller. It is the one place that decides:
//
//   - 409 Conflict on create: ErrNameInUse.
//   - 400 Bad Request (invalid argument), 401, 403, 404 and 501: the engine
//     refused the request itself; the error wraps jail.ErrPermanent.
//   - anything else (connection failures, 5xx, timeouts, a cancelled ctx) is
//     transient: retrying later may succeed.
//
// classify returns nil for a nil err.
func classify(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case op == opCreate && cerrdefs.IsConflict(err):
		return fmt.Errorf("docker %s: %w: %w", op, ErrNameInUse, err)
	case permanent(err):
		return fmt.Errorf("docker %s: %w: %w", op, err, jail.ErrPermanent)
	default:
		return fmt.Errorf("docker %s: %w", op, err)
	}
}

// permanent reports whether err is an answer from the daemon that repeating
// the same request cannot change.
func permanent(err error) bool {
	if transient(err) {
		return false
	}
	return cerrdefs.IsInvalidArgument(err) ||
		cerrdefs.IsNotFound(err) ||
		cerrdefs.IsUnauthorized(err) ||
		cerrdefs.IsPermissionDenied(err) ||
		cerrdefs.IsNotImplemented(err)
}

// transient reports whether err may go away on its own: the daemon could not
// be reached, was unavailable or failed internally, or the request timed out.
// A cancelled context is not transient: the caller gave up.
func transient(err error) bool {
	switch {
	case err == nil, errors.Is(err, context.Canceled):
		return false
	case client.IsErrConnectionFailed(err),
		errors.Is(err, context.DeadlineExceeded),
		cerrdefs.IsUnavailable(err),
		cerrdefs.IsInternal(err),
		cerrdefs.IsUnknown(err),
		cerrdefs.IsDeadlineExceeded(err):
		return true
	}
	return false
}

// Names of daemon calls, used in error messages and by classify.
const (
	opPing          = "ping"
	opInfo          = "info"
	opImageInspect  = "image inspect"
	opCreate        = "container create"
	opAttach        = "container attach"
	opWait          = "container wait"
	opStart         = "container start"
	opInspect       = "container inspect"
	opStop          = "container stop"
	opRemove        = "container remove"
	opList          = "container list"
	opKill          = "container kill"
	opLogs          = "container logs"
	opVolumeCreate  = "volume create"
	opVolumeRemove  = "volume remove"
	opVolumeList    = "volume list"
	opVolumeInspect = "volume inspect"
)

// retry calls fn until it succeeds, returns an error that is not transient,
// ctx ends or maxElapsed has passed, backing off exponentially between
// attempts. It is used only for idempotent calls (inspect, list, remove).
func retry(ctx context.Context, maxElapsed time.Duration, fn func(ctx context.Context) error) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 2 * time.Second
	b.MaxElapsedTime = maxElapsed
	return backoff.Retry(func() error {
		err := fn(ctx)
		if err != nil && !transient(err) {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(b, ctx))
}

// removalInProgress reports whether err is the daemon's 409 answer to a
// remove of a container it is already removing.
func removalInProgress(err error) bool {
	return cerrdefs.IsConflict(err) && strings.Contains(err.Error(), "already in progress")
}
