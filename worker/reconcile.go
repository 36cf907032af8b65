package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// reconcile removes this installation's jetcrew containers, in any state, that no live run owns
// and that are older than OrphanGrace. A container is owned when its run is
// in this worker's active set, or when the worker on its label is alive (its
// heartbeat key exists) and is not this worker. This worker's own containers
// that are not in its active set are left over from a previous process with
// the same id, so they are orphans too.
func (w *Worker) reconcile(ctx context.Context) error {
	cs, err := w.cfg.Runtime.ListManaged(ctx)
	if err != nil {
		return err
	}
	w.mu.Lock()
	activeContainers := make(map[string]bool, len(w.active))
	activeDirs := make(map[string]bool, len(w.active))
	for id, a := range w.active {
		activeContainers[a.container.ID()] = true
		activeDirs[w.runDir(id)] = true
	}
	w.mu.Unlock()
	w.removeStaleRunDirs(activeDirs)
	w.removeStaleWorkspaces()

	alive := map[string]bool{}
	var errs []error
	for _, c := range cs {
		if activeContainers[c.ID] || c.Labels[LabelInstall] != w.install {
			continue
		}
		created := c.Created
		if t, err := time.Parse(time.RFC3339Nano, c.Labels[LabelCreated]); err == nil {
			created = t
		}
		if time.Since(created) < w.cfg.OrphanGrace {
			continue
		}
		owner := c.Labels[LabelWorker]
		if owner != w.cfg.ID {
			live, ok := alive[owner]
			if !ok {
				_, err := w.live.Get(ctx, owner)
				switch {
				case err == nil:
					live = true
				case isNotFound(err):
					live = false
				default:
					return fmt.Errorf("look up worker %s: %w", owner, err)
				}
				alive[owner] = live
			}
			if live {
				continue
			}
		}
		w.log.Info().Str("container_id", shortID(c.ID)).Str("name", c.Name).Str("state", c.State).
			Str("run_id", c.Labels[LabelRunID]).Str("owner", owner).Msg("removing orphaned container")
		if err := w.cfg.Runtime.Remove(ctx, c.ID); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", c.Name, err))
		}
	}
	return errors.Join(errs...)
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
