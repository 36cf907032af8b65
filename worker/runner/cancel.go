package runner

import (
	"context"
	"fmt"
	"time"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// Cancel versus start. A delivery is in the runner's registry from before
// it claims the run (handle), so a cancel that finds the run claimed —
// queued by a delivery, or running — asks this worker (StopRun) instead of
// writing the state itself. The runner decides under the registry's lock,
// once, whether
// the container may start (commitStart): a cancel that comes first is
// answered "will not run" and the run ends cancelled with no container ever
// created; a cancel that comes after is answered "stopping" and the
// container is stopped as soon as it exists (startedCancelled). A cancel of
// a run no delivery has claimed is decided by the compare-and-set of the
// state against the claim's. No container of a run starts after a "will not
// run" reply.

// commitStart decides whether the run's container may start: it returns
// false, with the run recorded cancelled, when a cancel reached this worker
// first; otherwise it commits to the start, after which a cancel is answered
// "stopping".
func (r *run) commitStart(ctx context.Context) bool {
	r.e.cfg.Failpoint(stage.FailpointBeforeStart)
	r.e.live.mu.Lock()
	cancelled := r.cancelled.Load()
	if !cancelled {
		r.startCommitted = true
	}
	r.e.live.mu.Unlock()
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

// startedCancelled records c as the run's container in the registry and
// reports whether a cancel arrived while it was being created; the caller
// then stops it at once. Tracking and the check are ordered by the
// registry's lock against StopRun, so a cancel is never missed between the
// two.
func (r *run) startedCancelled(c jail.Container) bool {
	r.e.live.track(r, c)
	return r.cancelled.Load()
}

// StopRun cancels run id when this worker holds it, and returns the reply
// for the canceller: before its container may start, the run is cancelled
// and never starts; after, the run is marked cancelled and its container
// stopped (SIGTERM, then SIGKILL after StopGrace). ok is false when this
// worker does not hold the run (the worker answering
// jetcrew.ctl.stop.<run_id> then stays silent).
func (e *Runner) StopRun(id string) (reply messages.CancelReply, ok bool) {
	e.live.mu.Lock()
	a := e.live.runs[id]
	var c jail.Container
	var committed bool
	if a != nil {
		// Under the registry's lock: the run's commitStart, and a
		// container tracked after this, see the flag.
		a.run.cancelled.Store(true)
		c, committed = a.container, a.run.startCommitted
	}
	e.live.mu.Unlock()
	if a == nil {
		return messages.CancelReply{}, false
	}
	if !committed {
		e.log.Info().Str("run_id", id).Msg("cancel before the container started: it will not start")
		return messages.CancelReply{RunID: id, Result: messages.CancelQueued, State: messages.StateCancelled, Worker: e.cfg.WorkerID,
			Message: "run was claimed but its container had not started; it is cancelled and will not run"}, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	a.run.event(ctx, messages.Event{Type: messages.EventCancel, Reason: "cancel requested; stopping the container"})
	cancel()
	if c != nil {
		e.stopAsync(c, a.run.log, "stop cancelled container")
	}
	return messages.CancelReply{RunID: id, Result: messages.CancelStopping, State: messages.StateRunning, Worker: e.cfg.WorkerID,
		Message: fmt.Sprintf("SIGTERM now, SIGKILL after %s; the run will end cancelled", e.cfg.StopGrace)}, true
}
