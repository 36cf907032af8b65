package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jetcrew/jetcrew/messages"
)

// FailpointBeforeStart is the crash point passed to Config.Failpoint after
// the run is claimed and its directory staged, right before claimStart
// decides, against a cancel, whether its container may start.
const FailpointBeforeStart = "before-start"

// claimStart decides, in one compare-and-set on the run's state, whether its
// container may start: it records the run running (no container id yet)
// against the revision this delivery holds. A cancel that finalised the run
// first makes that write fail, and the run ends here with no container ever
// created: a cancel reply saying "will not run" is always true. A cancel that
// comes after it finds the run running and asks this worker to stop it:
// claimStart tracks the run first (with no container), so that request is
// answered "stopping", and the container is stopped as soon as it exists
// (startedCancelled). It returns false when the run must not start; the run
// has then been handed back, failed or left to whoever finalised it.
func (r *run) claimStart(ctx context.Context) bool {
	w := r.w
	w.failpoint(FailpointBeforeStart)
	w.track(r, nil)
	r.state.State = messages.StateRunning
	r.state.StartedAt = time.Now().UTC()
	if err := r.putState(ctx); err != nil {
		w.untrack(r)
		r.state.State, r.state.StartedAt = messages.StateQueued, time.Time{}
		if errors.Is(err, errFenced) {
			r.lost(ctx, nil, nil)
			return false
		}
		r.retry(ctx, fmt.Errorf("record the run starting: %w", err))
		return false
	}
	return true
}

// startedCancelled records c as the run's container in the active set and
// reports whether a cancel arrived while it was being created; the caller
// then stops it at once. Tracking and the check are ordered by w.mu against
// onStop, so a cancel is never missed between the two.
func (r *run) startedCancelled(c Container) bool {
	r.w.track(r, c)
	return r.cancelled.Load()
}

// cancelledBeforeStart ends the run cancelled, with no container, when a
// cancel reached it after claimStart but before its container existed (or
// when creating it failed), and reports whether it did.
func (r *run) cancelledBeforeStart(ctx context.Context) bool {
	if !r.cancelled.Load() {
		return false
	}
	r.w.untrack(r)
	r.finish(ctx, messages.StateCancelled, "cancelled by request before its container started")
	return true
}
