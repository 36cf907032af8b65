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
	// alive reports whether worker id has a live heartbeat.
	alive func(ctx context.Context, id string) (bool, error)
	// sweepDirs removes the stale run directories not in active.
	sweepDirs func(active map[string]bool)
	now       func() time.Time
	log       zerolog.Logger
}

// Run reconciles every interval until ctx ends.
func (rc *reconciler) Run(ctx context.Context) {
	every(ctx, rc.interval, func() {
		if err := rc.reconcile(ctx); err != nil && ctx.Err() == nil {
			rc.log.Warn().Err(err).Msg("reconcile failed")
		}
	})
}

// reconcile removes the orphans once; it returns the removals that failed,
// or the error of a listing or a liveness lookup.
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
		if activeContainers[c.ID] || c.Labels[LabelInstall] != rc.install {
			continue
		}
		created := c.Created
		if t, err := time.Parse(time.RFC3339Nano, c.Labels[LabelCreated]); err == nil {
			created = t
		}
		if rc.now().Sub(created) < rc.grace {
			continue
		}
		owner := c.Labels[LabelWorker]
		if owner != rc.self {
			live, ok := alive[owner]
			if !ok {
				if live, err = rc.alive(ctx, owner); err != nil {
					return fmt.Errorf("look up worker %s: %w", owner, err)
				}
				alive[owner] = live
			}
			if live {
				continue
			}
		}
		rc.log.Info().Str("container_id", shortID(c.ID)).Str("name", c.Name).Str("state", c.State).
			Str("run_id", c.Labels[LabelRunID]).Str("owner", owner).Msg("removing orphaned container")
		if err := rc.remove(ctx, c.ID); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", c.Name, err))
		}
	}
	return errors.Join(errs...)
}

// newReconciler wires the reconciler to this worker: its runtime, its
// active runs, the workers bucket and its state directory.
func (w *Worker) newReconciler() *reconciler {
	return &reconciler{
		install: w.install, self: w.cfg.ID, grace: w.cfg.OrphanGrace, interval: w.cfg.ReconcileInterval,
		list: w.cfg.Runtime.ListManaged, remove: w.cfg.Runtime.Remove,
		active: w.activeSets,
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
		now: time.Now, log: w.log,
	}
}

// activeSets returns the container ids and run directories of the runs in
// flight.
func (w *Worker) activeSets() (containers, dirs map[string]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	containers = make(map[string]bool, len(w.active))
	dirs = make(map[string]bool, len(w.active))
	for id, a := range w.active {
		containers[a.container.ID()] = true
		dirs[w.runDir(id)] = true
	}
	return containers, dirs
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

// removeRunContainers removes every container of runID not in this worker's
// active set: earlier deliveries' containers, whoever created them.
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
	return nil
}
