package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/live"
)

// reconciler removes orphans: this installation's jetcrew containers, in
// any state, then its volumes, that nothing holds. It asks two questions
// of each, and nothing else. Is it held here? The registry of what is live
// (live.Registry) holds every container of this worker's by id or name
// (live.ContainerKey) and every volume by name (live.VolumeKey); what is
// labelled with this worker and a run it holds (live.RunKey) is held with
// the run. Is the owner on its label alive? An owner registered here (the
// warm pool: live.Registry.Register) holds everything of its own, so what
// its label says is its but it does not hold is an orphan at once; any
// other is given the grace (a container being made, a heartbeat late)
// and is then an orphan when it is this worker's (left by its earlier
// process) or its worker has no heartbeat key. A run's own containers are
// judged first, and a run's other containers (its capture container, which
// holds its workspace's volume) are kept while its own container is, so
// that a successor adopting the run finds them. Its three inputs are the
// runtime, the registry and the liveness lookup; a test drives it over
// fixture lists.
type reconciler struct {
	rt    orphanRuntime
	live  *live.Registry
	alive func(ctx context.Context, worker string) (bool, error)
	// adopt, when set, is asked about a run's container found orphaned
	// before it is removed: it reports whether to keep it (the run was
	// adopted, or another live worker holds it; Worker.adopt).
	adopt func(ctx context.Context, c jail.ManagedContainer) (adoptVerdict, error)
	// since is when the reconciler was made, as the worker's process
	// started: a container of this worker's id made before is its
	// earlier process's.
	since time.Time
	reconcileSettings
	loop
}

// orphanRuntime is what the reconciler uses of a jail.Runtime.
type orphanRuntime interface {
	ListManaged(ctx context.Context) ([]jail.ManagedContainer, error)
	Remove(ctx context.Context, id string) error
	ListManagedVolumes(ctx context.Context) ([]jail.ManagedVolume, error)
	RemoveVolume(ctx context.Context, name string) error
}

// reconcileSettings are the reconciler's settings.
type reconcileSettings struct {
	install  string        // this installation's jail.LabelInstall value
	self     string        // this worker's id
	grace    time.Duration // the youngest age an orphan of an owner not registered here is removed at
	interval time.Duration // how often the reconciler passes
	soon     time.Duration // when, after its start, it passes once more (0: not)
	now      func() time.Time
	log      zerolog.Logger
}

// newReconciler returns the reconciler of rt's containers and volumes,
// asking reg what is held here and alive whether a worker has a heartbeat.
func newReconciler(rt orphanRuntime, reg *live.Registry, alive func(ctx context.Context, worker string) (bool, error), s reconcileSettings) *reconciler {
	return &reconciler{rt: rt, live: reg, alive: alive, reconcileSettings: s, since: s.now()}
}

// verdict is what becomes of a container or volume.
type verdict int

const (
	keep      verdict = iota
	orphanNow         // its owner is registered here and does not hold it
	orphan            // older than the grace, its owner gone
	adoptOnly         // a run's container younger than the grace, its owner gone: adopted, else kept
	adoptKeep         // a run's container of this worker's id whose run a delivery here decides: offered for adoption, kept
)

// reconcile removes the orphans once, containers then volumes; it returns
// the removals that failed, or the error of a listing or a liveness
// lookup.
func (rc *reconciler) reconcile(ctx context.Context) error {
	cs, err := rc.rt.ListManaged(ctx)
	if err != nil {
		return err
	}
	alive := map[string]bool{} // the liveness lookups of this pass
	// Runs' own containers first: a run's helper containers (its capture
	// container, which holds its workspace) are kept while its container
	// is, so that an adopter finds them (a worker's first pass keeps an
	// orphaned run's container for the adoption pass).
	slices.SortStableFunc(cs, func(a, b jail.ManagedContainer) int {
		return cmp.Compare(runFirst(a.Labels), runFirst(b.Labels))
	})
	keptRuns := map[string]bool{}
	var errs []error
	for _, c := range cs {
		v, err := rc.judge(ctx, c.Labels, c.Created, alive, live.ContainerKey+c.ID, live.ContainerKey+c.Name)
		if err != nil {
			return err
		}
		run := c.Labels[jail.LabelRunID]
		if run != "" && !isRunContainer(c.Labels) && keptRuns[run] {
			v = keep
		}
		why := rc.removal(ctx, c, v)
		if why == "" {
			keptRuns[run] = keptRuns[run] || isRunContainer(c.Labels)
			continue
		}
		rc.log.Info().Str("container_id", c.ID[:min(12, len(c.ID))]).Str("name", c.Name).Str("state", c.State).
			Str("run_id", run).Str("owner", c.Labels[jail.LabelWorker]).Msg(why)
		if err := rc.rt.Remove(ctx, c.ID); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", c.Name, err))
		}
	}
	return errors.Join(append(errs, rc.reconcileVolumes(ctx, alive))...)
}

// removal says why container c, judged v, is removed, asking the adopt
// hook about a run's container first; "" keeps it.
func (rc *reconciler) removal(ctx context.Context, c jail.ManagedContainer, v verdict) string {
	switch v {
	case adoptKeep:
		rc.adoptable(ctx, c)
	case adoptOnly:
		if rc.adoptable(ctx, c) == removeIt {
			return "removing the container of a run that ended while no worker held it"
		}
	case orphanNow:
		return "removing a warm container no pool or run holds"
	case orphan:
		if rc.adoptable(ctx, c) != keepIt {
			return "removing orphaned container"
		}
	}
	return ""
}

// adoptable asks the adopt hook about c, a run's container found
// orphaned; an error of the hook keeps it (logged: the next pass asks
// again).
func (rc *reconciler) adoptable(ctx context.Context, c jail.ManagedContainer) adoptVerdict {
	if rc.adopt == nil || !isRunContainer(c.Labels) {
		return orphanRules
	}
	v, err := rc.adopt(ctx, c)
	if err != nil {
		rc.log.Warn().Err(err).Str("run_id", c.Labels[jail.LabelRunID]).Msg("adopt an orphaned run; trying again")
		return keepIt
	}
	return v
}

// reconcileVolumes removes this installation's volumes by the rules of
// containers (judge); a volume a container still mounts is left for a
// later pass.
func (rc *reconciler) reconcileVolumes(ctx context.Context, alive map[string]bool) error {
	vs, err := rc.rt.ListManagedVolumes(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, v := range vs {
		verdict, err := rc.judge(ctx, v.Labels, v.Created, alive, live.VolumeKey+v.Name)
		if err != nil {
			return err
		}
		if verdict == keep || verdict == adoptKeep {
			continue
		}
		rc.log.Info().Str("volume", v.Name).Str("run_id", v.Labels[jail.LabelRunID]).Msg("removing orphaned volume")
		if err := rc.rt.RemoveVolume(ctx, v.Name); err != nil {
			errs = append(errs, fmt.Errorf("remove volume %s: %w", v.Name, err))
		}
	}
	return errors.Join(errs...)
}

// judge says what becomes of a container or volume with these labels,
// created then (jail.LabelCreated wins when it parses), known here by
// keys: kept when it is of another installation or held here (its keys,
// or the run on its label when the label names this worker: a run's own
// container is then offered for adoption, and kept); an orphan at
// once when the owner on its label is registered here; else kept while
// younger than the grace, and then an orphan when it is this worker's or
// its worker has no live heartbeat. alive caches the liveness lookups of
// one pass.
func (rc *reconciler) judge(ctx context.Context, labels map[string]string, created time.Time, alive map[string]bool, keys ...string) (verdict, error) {
	if labels[jail.LabelInstall] != rc.install {
		return keep, nil
	}
	worker, self := labels[jail.LabelWorker], labels[jail.LabelWorker] == rc.self
	if rc.live.Held(keys...) {
		return keep, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, labels[jail.LabelCreated]); err == nil {
		created = t
	}
	if run := labels[jail.LabelRunID]; self && run != "" && rc.live.Held(live.RunKey+run) {
		// A delivery of the run is in flight here: its container may
		// still be being made (not yet known by id), and the delivery
		// removes an earlier attempt's, so nothing is removed. A run's
		// own container this worker's earlier process left is offered
		// for adoption all the same: the delivery may be a redelivery
		// that leaves the run to whoever adopts it (the run's record's
		// compare-and-set settles which of the two holds it).
		if isRunContainer(labels) && created.Before(rc.since) {
			return adoptKeep, nil
		}
		return keep, nil
	}
	if self && rc.live.Registered(ownerOnLabel(labels)) {
		return orphanNow, nil
	}
	young := rc.now().Sub(created) < rc.grace
	if young && !isRunContainer(labels) {
		return keep, nil
	}
	up := false
	if !self {
		var ok bool
		if up, ok = alive[worker]; !ok {
			var err error
			if up, err = rc.alive(ctx, worker); err != nil {
				return keep, fmt.Errorf("look up worker %s: %w", worker, err)
			}
			alive[worker] = up
		}
	}
	switch {
	case up:
		return keep, nil
	case young:
		// A run's container whose worker is gone may be adopted at once;
		// it is removed only past the grace.
		return adoptOnly, nil
	}
	return orphan, nil
}

// runFirst orders a run's own container (0) before any other (1).
func runFirst(labels map[string]string) int {
	if isRunContainer(labels) {
		return 0
	}
	return 1
}

// isRunContainer reports whether labels are a run's own container's
// (jail.RoleRun, a run id): one a successor may adopt.
func isRunContainer(labels map[string]string) bool {
	return labels[jail.LabelRole] == jail.RoleRun && labels[jail.LabelRunID] != ""
}

// ownerOnLabel returns the owner, on the worker its labels name, of a
// container or volume: the run on its label; the warm pool for a warm
// container and for the capture container made beside one (its role
// capture, no run id yet: tree.Trees.MakeWarm); else the worker.
func ownerOnLabel(labels map[string]string) live.Owner {
	switch run, role := labels[jail.LabelRunID], labels[jail.LabelRole]; {
	case run != "":
		return live.Run(run)
	case role == jail.RoleWarm || role == jail.RoleCapture:
		return live.Pool
	}
	return live.Worker
}

// Start removes the orphans once, failing when it cannot (the worker then
// does not start), then every interval until Stop.
func (rc *reconciler) Start(ctx context.Context) error {
	if err := rc.reconcile(ctx); err != nil {
		return fmt.Errorf("worker: reconcile containers: %w", err)
	}
	pass := func() {
		if err := rc.reconcile(ctx); err != nil && ctx.Err() == nil {
			rc.log.Warn().Err(err).Msg("reconcile failed")
		}
	}
	rc.loop.start(ctx, func(ctx context.Context) {
		if rc.soon > 0 && rc.soon < rc.interval {
			// A worker killed just before this one started still has
			// its heartbeat key: its runs are adopted once it expired.
			sleepCtx(ctx, rc.soon)
			pass()
		}
		every(ctx, rc.interval, pass)
	})
	return nil
}

// Stop ends the passes and waits for the one under way.
func (rc *reconciler) Stop(context.Context) error {
	rc.loop.stop()
	return nil
}

// sweeper removes what the stages left on the host that no live run holds
// (stale run and workspace directories, cached snapshots, staged
// binaries), at start and every interval until Stop.
type sweeper struct {
	interval time.Duration
	sweep    func()
	loop
}

// Start sweeps once, then every interval until Stop.
func (s *sweeper) Start(ctx context.Context) error {
	s.sweep()
	s.loop.start(ctx, func(ctx context.Context) { every(ctx, s.interval, s.sweep) })
	return nil
}

// Stop ends the sweeps and waits for the one under way.
func (s *sweeper) Stop(context.Context) error {
	s.loop.stop()
	return nil
}

// newReconciler returns the reconciler of this worker: its runtime, its
// registry of what is live, and the heartbeats in the workers bucket
// (presence.alive).
func (w *Worker) newReconciler() *reconciler {
	rc := newReconciler(w.cfg.Runtime, w.live, w.presence.alive, reconcileSettings{install: w.install, self: w.cfg.ID,
		grace: w.cfg.OrphanGrace, interval: w.cfg.ReconcileInterval, now: time.Now, log: w.log,
		soon: messages.WorkerTTL + 2*time.Second})
	rc.adopt = w.adopt
	return rc
}

// newSweeper returns the sweeper of the stages' leftovers on this worker.
func (w *Worker) newSweeper() *sweeper {
	return &sweeper{interval: w.cfg.ReconcileInterval, sweep: func() {
		w.runDirs.Sweep(w.cfg.OrphanGrace)
		w.dir.reclaim()
		w.trees.Sweep(w.cfg.OrphanGrace)
		if err := w.bridges.GC(); err != nil {
			w.log.Warn().Err(err).Msg("remove unused staged bridges")
		}
	}}
}
