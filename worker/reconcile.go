package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

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
	install  string        // this installation's LabelInstall value
	self     string        // this worker's id
	grace    time.Duration // the youngest age an orphan is removed at
	interval time.Duration // how often Run reconciles
	list     func(ctx context.Context) ([]ManagedContainer, error)
	remove   func(ctx context.Context, id string) error
	// active returns the container ids and run directories of the runs in
	// flight.
	active func() (containers, dirs map[string]bool)
	// holds reports whether this worker holds run id now (its container may
	// still be being created, not yet known by id); nil: never.
	holds func(runID string) bool
	// alive reports whether worker id has a live heartbeat.
	alive func(ctx context.Context, id string) (bool, error)
	// sweepDirs removes the stale run directories not in active.
	sweepDirs func(active map[string]bool)
	// listVolumes and removeVolume reach the runtime's volumes
	// (workspaces); liveVolume reports whether a delivery of this worker
	// uses one. listVolumes nil: volumes are not reconciled.
	listVolumes  func(ctx context.Context) ([]ManagedVolume, error)
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
	activeContainers, activeDirs := rc.active()
	rc.sweepDirs(activeDirs)
	alive := map[string]bool{}
	var errs []error
	for _, c := range cs {
		if activeContainers[c.ID] {
			continue
		}
		orphan, err := rc.orphan(ctx, c.Labels, c.Created, alive)
		if err != nil {
			return err
		}
		if !orphan {
			continue
		}
		rc.log.Info().Str("container_id", shortID(c.ID)).Str("name", c.Name).Str("state", c.State).
			Str("run_id", c.Labels[LabelRunID]).Str("owner", c.Labels[LabelWorker]).Msg("removing orphaned container")
		if err := rc.remove(ctx, c.ID); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", c.Name, err))
		}
	}
	return errors.Join(append(errs, rc.reconcileVolumes(ctx, alive))...)
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
		rc.log.Info().Str("volume", v.Name).Str("run_id", v.Labels[LabelRunID]).Msg("removing orphaned volume")
		if err := rc.removeVolume(ctx, v.Name); err != nil {
			errs = append(errs, fmt.Errorf("remove volume %s: %w", v.Name, err))
		}
	}
	return errors.Join(errs...)
}

// orphan reports whether a container or volume with these labels, created
// then (LabelCreated wins when it parses), is an orphan: of this
// installation, not of a run this worker holds, at least grace old, and
// owned by this worker or by one without a live heartbeat. alive caches
// the liveness lookups of one pass.
func (rc *reconciler) orphan(ctx context.Context, labels map[string]string, created time.Time, alive map[string]bool) (bool, error) {
	if labels[LabelInstall] != rc.install {
		return false, nil
	}
	owner := labels[LabelWorker]
	if owner == rc.self && rc.holds != nil && rc.holds(labels[LabelRunID]) {
		// A run this worker holds: its container may still be being
		// created (not yet known by id); its own delivery removes an
		// earlier attempt's.
		return false, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, labels[LabelCreated]); err == nil {
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

// newReconciler wires the reconciler to this worker: its runtime, its
// active runs, the workers bucket and its state directory.
func (w *Worker) newReconciler() *reconciler {
	return &reconciler{
		install: w.install, self: w.cfg.ID, grace: w.cfg.OrphanGrace, interval: w.cfg.ReconcileInterval,
		list: w.cfg.Runtime.ListManaged, remove: w.cfg.Runtime.Remove,
		active: w.activeSets, holds: w.holds,
		alive: func(ctx context.Context, id string) (bool, error) {
			_, err := w.live.Get(ctx, id)
			if isNotFound(err) {
				return false, nil
			}
			return err == nil, err
		},
		sweepDirs: func(active map[string]bool) {
			w.sweepStaged(active)
			w.removeStaleWorkspaces()
		},
		listVolumes: w.cfg.Runtime.ListManagedVolumes, removeVolume: w.cfg.Runtime.RemoveVolume,
		liveVolume: func(name string) bool { return w.isLive(volumeKey(name)) },
		now:        time.Now, log: w.log,
	}
}

// activeSets returns the container ids and run directories of the runs in
// flight.
func (w *Worker) activeSets() (containers, dirs map[string]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	containers = make(map[string]bool, len(w.active))
	dirs = make(map[string]bool, len(w.active))
	for _, a := range w.active {
		if a.container != nil { // nil while its container is being created
			containers[a.container.ID()] = true
		}
		dirs[a.run.dir()] = true
	}
	return containers, dirs
}

// holds reports whether a run of id is in flight on this worker.
func (w *Worker) holds(runID string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.active[runID] != nil
}

// sweepStaged removes stale run directories not in active, and staged
// bridge copies no run in flight refers to (the current copy stays).
func (w *Worker) sweepStaged(active map[string]bool) {
	w.removeStaleRunDirs(active)
	w.mu.Lock()
	keep := make(map[string]bool, len(w.active))
	for _, a := range w.active {
		keep[a.run.bridge] = true
	}
	w.mu.Unlock()
	if err := w.bridges.gc(keep); err != nil {
		w.log.Warn().Err(err).Msg("remove unused staged bridges")
	}
}

// removeStaleRunDirs removes staged run directories (and their sockets) that
// no active run owns and that are older than OrphanGrace: left over by a
// crash of this worker's process.
func (w *Worker) removeStaleRunDirs(active map[string]bool) {
	root := filepath.Join(w.cfg.StateDir, "r")
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		dir := filepath.Join(root, e.Name())
		info, err := e.Info()
		if err != nil || active[dir] || time.Since(info.ModTime()) < w.cfg.OrphanGrace {
			continue
		}
		w.log.Info().Str("dir", dir).Msg("removing a stale run directory")
		if err := os.RemoveAll(dir); err != nil {
			w.log.Warn().Err(err).Str("dir", dir).Msg("remove stale run directory")
		}
	}
}

// removeRunContainers removes every container of runID, whoever created
// it (earlier deliveries' containers: the caller's delivery has none yet),
// then the run's workspace volumes that no delivery of this worker uses.
func (w *Worker) removeRunContainers(ctx context.Context, runID string) error {
	cs, err := w.cfg.Runtime.ListManaged(ctx)
	if err != nil {
		return err
	}
	for _, c := range cs {
		if c.Labels[LabelRunID] != runID || c.Labels[LabelInstall] != w.install {
			continue
		}
		w.log.Info().Str("container_id", shortID(c.ID)).Str("name", c.Name).Str("run_id", runID).
			Msg("removing an earlier delivery's container")
		if err := w.cfg.Runtime.Remove(ctx, c.ID); err != nil {
			return fmt.Errorf("remove %s: %w", c.Name, err)
		}
	}
	vs, err := w.cfg.Runtime.ListManagedVolumes(ctx)
	if err != nil {
		return err
	}
	for _, v := range vs {
		if v.Labels[LabelRunID] != runID || v.Labels[LabelInstall] != w.install || w.isLive(volumeKey(v.Name)) {
			continue
		}
		w.log.Info().Str("volume", v.Name).Str("run_id", runID).Msg("removing an earlier delivery's volume")
		if err := w.cfg.Runtime.RemoveVolume(ctx, v.Name); err != nil {
			return fmt.Errorf("remove volume %s: %w", v.Name, err)
		}
	}
	return nil
}
