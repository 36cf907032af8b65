package worker

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/runner"
)

// adoptOrphans runs one reconciler pass once the puller can run adopted
// runs: the orphaned runs on the engine (their workers stopped or died)
// are adopted before anything else removes what they use. It returns nil:
// a pass that fails is logged, and the reconciler's next pass tries again.
func (w *Worker) adoptOrphans(ctx context.Context) error {
	start := time.Now()
	if err := w.rc.reconcile(ctx); err != nil {
		w.log.Warn().Err(err).Msg("adoption pass failed; the reconciler tries again")
	}
	w.log.Debug().Dur("took", time.Since(start)).Msg("adoption pass done")
	return nil
}

// adopt is the reconciler's hook for a run container it found orphaned
// (its worker has no heartbeat, or it is this worker's id's from an
// earlier process): it says to keep the container, because the run was
// adopted here or another live worker holds it; to remove it at once,
// because the run's record is final; or to leave it to the orphan rules.
// Before the puller runs (the reconciler's first pass at start), every
// such container is kept for the adoption pass that follows
// (adoptOrphans).
func (w *Worker) adopt(ctx context.Context, c jail.ManagedContainer) (adoptVerdict, error) {
	if c.State != "running" && c.State != "exited" {
		return orphanRules, nil
	}
	if w.pull == nil || !w.pull.accepting() {
		return keepIt, nil
	}
	res, err := w.runs.Adopt(ctx, runner.AdoptCandidate{ID: c.ID, Labels: c.Labels}, w.presence.alive, w.pull.spawn)
	if err != nil {
		return keepIt, err
	}
	if res.Verdict != runner.NotAdoptable {
		return keepIt, nil
	}
	w.log.Info().Str("container_id", c.ID[:min(12, len(c.ID))]).Str("run_id", c.Labels[jail.LabelRunID]).
		Str("why", res.Reason).Msg("orphaned run cannot be adopted")
	if res.Ended {
		return removeIt, nil
	}
	return orphanRules, nil
}

// adoptVerdict is what becomes of a run's container the adopt hook was
// asked about.
type adoptVerdict int

const (
	orphanRules adoptVerdict = iota // not adopted: the orphan rules (the grace) decide
	keepIt                          // adopted here, or held by a live worker
	removeIt                        // its run ended: removed at once
)

// mountedUnder reports whether a jetcrew container on the engine, of any
// installation and in any state, bind-mounts a path under dir (a run
// directory in a dead worker's state directory). When the engine cannot
// be asked, it says yes: the directory is kept.
func (w *Worker) mountedUnder(dir string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := w.cfg.Runtime.ListManaged(ctx)
	if err != nil {
		return true
	}
	for _, c := range cs {
		for _, b := range c.Binds {
			if strings.HasPrefix(b, dir+"/") {
				return true
			}
		}
	}
	return false
}

// errNotLive says a running run's record is all that is left of it: no
// live worker holds it and none will adopt it.
var errNotLive = errors.New("no worker holds the run")

// liveRun is the dead-letterer's question about a running run, recorded
// as st, whose request (its body, request) ran out of deliveries: nil
// when a live worker holds it (the request is then left to that worker,
// which removes it when the run ends); errAwaitAdoption while a successor
// of its dead worker may yet adopt it (its record is younger than the
// adoption grace and a heartbeat's time, and its stages can be taken
// over); errNotLive otherwise, and the run is failed as before.
func (w *Worker) liveRun(_ context.Context, st messages.RunState, request []byte) error {
	if w.runs.HeldLive(st.ID) {
		return nil
	}
	req, err := messages.DecodeRunRequest(request)
	if err == nil && st.Lease != "" && time.Since(st.UpdatedAt) < w.cfg.AdoptGrace+messages.WorkerTTL && w.runs.MayBeAdopted(req, st) {
		return errAwaitAdoption
	}
	return errNotLive
}
