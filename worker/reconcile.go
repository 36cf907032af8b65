package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/runstate"
	"github.com/rs/zerolog"
)

// reconciler removes orphaned containers: this installation's jetcrew
// containers, in any state, that no live run owns and that are older than
// grace. A container is owned when its run is in this worker's active set,
// or when the worker on its label is alive (its heartbeat key exists) and is
// not this worker. This worker's own containers that are not in its active
// set are left over from a previous process with the same id, so they are
// orphans too. Its I/O is in function fields, so a test drives it over a
// fixture container list.
type reconciler struct {
	install  string        // this installation's jail.LabelInstall value
	self     string        // this worker's id
	grace    time.Duration // the youngest age an orphan is removed at
	interval time.Duration // how often Run reconciles
	list     func(ctx context.Context) ([]jail.ManagedContainer, error)
	remove   func(ctx context.Context, id string) error
	// active returns the container ids of the runs in flight.
	active func() map[string]bool
	// holds reports whether this worker holds run id now (its container may
	// still be being created, not yet known by id); nil: never.
	holds func(runID string) bool
	// warmOwned reports whether this worker's warm pool holds the warm
	// container named name (being made, ready, or claimed and not yet its
	// run's); nil: never. A warm container of this worker that neither it
	// nor a run holds is an orphan at once, whatever its age (one left by
	// this worker's earlier process, found when it starts).
	warmOwned func(name string) bool
	// warmHeld reports whether the container name is what a warm
	// container's workspace made beside it (its capture container) and a
	// pool or a run still holds it (Trees.WarmCaptureHeld); nil: never.
	warmHeld func(name string) bool
	// alive reports whether worker id has a live heartbeat.
	alive func(ctx context.Context, id string) (bool, error)
	// sweep removes what the stages left on the host that no live run
	// holds (stale run and workspace directories, cached snapshots, staged
	// binaries).
	sweep func()
	// listVolumes and removeVolume reach the runtime's volumes
	// (workspaces); liveVolume reports whether a delivery of this worker
	// uses one. listVolumes nil: volumes are not reconciled.
	listVolumes  func(ctx context.Context) ([]jail.ManagedVolume, error)
	removeVolume func(ctx context.Context, name string) error
	liveVolume   func(name string) bool
	now          func() time.Time
	log          zerolog.Logger
}

// Run reconciles every interval until ctx ends.
func (rc *reconciler) Run(ctx context.Context) {
	every(ctx, rc.interval, func() {
		if err := rc.reconcile(ctx); err != nil && ctx.Err() == nil {
			rc.log.Warn().Err(err).Msg("reconcile failed")
		}
	})
}

// reconcile removes the orphans once, containers then volumes; it returns
// the removals that failed, or the error of a listing or a liveness
// lookup.
func (rc *reconciler) reconcile(ctx context.Context) error {
	cs, err := rc.list(ctx)
	if err != nil {
		return err
	}
	activeContainers := rc.active()
	rc.sweep()
	alive := map[string]bool{}
	var errs []error
	for _, c := range cs {
		if activeContainers[c.ID] {
			continue
		}
		if rc.ownWarm(c) {
			// The pool is asked first: a container it hands a run is in
			// the run's registry before the pool lets it go.
			if rc.warmOwned != nil && rc.warmOwned(c.Name) || rc.warmHeld != nil && rc.warmHeld(c.Name) || rc.active()[c.ID] {
				continue
			}
			rc.log.Info().Str("container_id", c.ID[:min(12, len(c.ID))]).Str("name", c.Name).Msg("removing a warm container no pool or run holds")
			if err := rc.remove(ctx, c.ID); err != nil {
				errs = append(errs, fmt.Errorf("remove %s: %w", c.Name, err))
			}
			continue
		}
		orphan, err := rc.orphan(ctx, c.Labels, c.Created, alive)
		if err != nil {
			return err
		}
		if !orphan {
			continue
		}
		rc.log.Info().Str("container_id", c.ID[:min(12, len(c.ID))]).Str("name", c.Name).Str("state", c.State).
			Str("run_id", c.Labels[jail.LabelRunID]).Str("owner", c.Labels[jail.LabelWorker]).Msg("removing orphaned container")
		if err := rc.remove(ctx, c.ID); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", c.Name, err))
		}
	}
	return errors.Join(append(errs, rc.reconcileVolumes(ctx, alive))...)
}

// ownWarm reports whether c is a warm container of this worker (of this
// installation), or one made beside it: a capture container without a run
// id is a warm container's, made with its workspace (tree.Trees.MakeWarm).
func (rc *reconciler) ownWarm(c jail.ManagedContainer) bool {
	role := c.Labels[jail.LabelRole]
	warm := role == jail.RoleWarm || role == jail.RoleCapture && c.Labels[jail.LabelRunID] == ""
	return warm && c.Labels[jail.LabelWorker] == rc.self && c.Labels[jail.LabelInstall] == rc.install
}

// reconcileVolumes removes this installation's volumes that no delivery of
// this worker uses and that are orphans by the rules of containers
// (orphan); a volume a container still mounts is left for a later pass.
func (rc *reconciler) reconcileVolumes(ctx context.Context, alive map[string]bool) error {
	if rc.listVolumes == nil {
		return nil
	}
	vs, err := rc.listVolumes(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, v := range vs {
		if rc.liveVolume(v.Name) {
			continue
		}
		orphan, err := rc.orphan(ctx, v.Labels, v.Created, alive)
		if err != nil {
			return err
		}
		if !orphan {
			continue
		}
		rc.log.Info().Str("volume", v.Name).Str("run_id", v.Labels[jail.LabelRunID]).Msg("removing orphaned volume")
		if err := rc.removeVolume(ctx, v.Name); err != nil {
			errs = append(errs, fmt.Errorf("remove volume %s: %w", v.Name, err))
		}
	}
	return errors.Join(errs...)
}

// orphan reports whether a container or volume with these labels, created
// then (jail.LabelCreated wins when it parses), is an orphan: of this
// installation, not of a run this worker holds, at least grace old, and
// owned by this worker or by one without a live heartbeat. alive caches
// the liveness lookups of one pass.
func (rc *reconciler) orphan(ctx context.Context, labels map[string]string, created time.Time, alive map[string]bool) (bool, error) {
	if labels[jail.LabelInstall] != rc.install {
		return false, nil
	}
	owner := labels[jail.LabelWorker]
	if owner == rc.self && rc.holds != nil && rc.holds(labels[jail.LabelRunID]) {
		// A run this worker holds: its container may still be being
		// created (not yet known by id); its own delivery removes an
		// earlier attempt's.
		return false, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, labels[jail.LabelCreated]); err == nil {
		created = t
	}
	if rc.now().Sub(created) < rc.grace {
		return false, nil
	}
	if owner == rc.self {
		return true, nil
	}
	live, ok := alive[owner]
	if !ok {
		var err error
		if live, err = rc.alive(ctx, owner); err != nil {
			return false, fmt.Errorf("look up worker %s: %w", owner, err)
		}
		alive[owner] = live
	}
	return !live, nil
}

// activeContainers returns the ids of the containers this worker's runs
// and warm pool hold.
func (w *Worker) activeContainers() map[string]bool {
	m := w.runs.Containers()
	for _, id := range w.warm.ContainerIDs() {
		m[id] = true
	}
	return m
}

// newReconciler wires the reconciler to this worker: its runtime, its
// active runs, the workers bucket and its state directory.
func (w *Worker) newReconciler() *reconciler {
	return &reconciler{
		install: w.install, self: w.cfg.ID, grace: w.cfg.OrphanGrace, interval: w.cfg.ReconcileInterval,
		list: w.cfg.Runtime.ListManaged, remove: w.cfg.Runtime.Remove,
		active: w.activeContainers, holds: w.runs.Holds, warmOwned: w.warm.Owns, warmHeld: w.trees.WarmCaptureHeld,
		alive: func(ctx context.Context, id string) (bool, error) {
			_, err := w.live.Get(ctx, id)
			if runstate.IsNotFound(err) {
				return false, nil
			}
			return err == nil, err
		},
		sweep: func() {
			w.runDirs.Sweep(w.cfg.OrphanGrace)
			w.trees.Sweep(w.cfg.OrphanGrace)
			if err := w.bridges.GC(); err != nil {
				w.log.Warn().Err(err).Msg("remove unused staged bridges")
			}
		},
		listVolumes: w.cfg.Runtime.ListManagedVolumes, removeVolume: w.cfg.Runtime.RemoveVolume,
		liveVolume: w.trees.VolumeHeld,
		now:        time.Now, log: w.log,
	}
}
