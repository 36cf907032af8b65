package worker

import (
	"context"

	"github.com/jetcrew/jetcrew/messages"
)

// Cancel versus start. A delivery is in the worker's active set from before
// it claims the run (handle), so a cancel that finds the run claimed —
// queued by a delivery, or running — asks this worker (onStop) instead of
// writing the state itself. The worker decides under w.mu, once, whether
// the container may start (commitStart): a cancel that comes first is
// answered "will not run" and the run ends cancelled with no container ever
// created; a cancel that comes after is answered "stopping" and the
// container is stopped as soon as it exists (startedCancelled). A cancel of
// a run no delivery has claimed is decided by the compare-and-set of the
// state against the claim's. No container of a run starts after a "will not
// run" reply.

// FailpointBeforeStart is the crash point passed to Config.Failpoint after a
// run is claimed and staged, right before commitStart decides whether its
// container may start.
const FailpointBeforeStart = "before-start"

// commitStart decides whether the run's container may start: it returns
// false, with the run recorded cancelled, when a cancel reached this worker
// first; otherwise it commits to the start, after which a cancel is answered
// "stopping".
func (r *run) commitStart(ctx context.Context) bool {
	r.w.failpoint(FailpointBeforeStart)
	r.w.mu.Lock()
	cancelled := r.cancelled.Load()
	if !cancelled {
		r.startCommitted = true
	}
	r.w.mu.Unlock()
	if cancelled {
		r.finish(ctx, messages.StateCancelled, "cancelled by request before its container started")
		return false
	}
	return true
}

// cancelledBeforeStart ends the run cancelled when a cancel reached it after
// commitStart but creating its container failed, and reports whether it did.
func (r *run) cancelledBeforeStart(ctx context.Context) bool {
	if !r.cancelled.Load() {
		return false
	}
	r.finish(ctx, messages.StateCancelled, "cancelled by request before its container started")
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

// claimedByDelivery reports whether a queued record was written by a
// delivery that claimed the run (not by the submitter or a cancel): its
// worker may be about to start it, so a cancel asks that worker.
func claimedByDelivery(st messages.RunState) bool {
	return st.State == messages.StateQueued && st.StreamSeq != 0
}
