package worker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/worker/internal/privdir"
)

// DefaultStateRoot is where a worker without a state directory of its own
// (Config.StateDir) makes one, when it may create it (as root): a fixed,
// neutral place, so that what a run sees of its mounts
// (/proc/self/mountinfo) names nothing of the host but it and a random
// name. Elsewhere the root is os.TempDir().
const DefaultStateRoot = "/var/lib/jetcrew/state"

// stateDir is the worker's state directory (Config.StateDir): Start makes
// it, or checks the one configured, and Stop removes what the worker made
// in it.
type stateDir struct {
	// configured and root are Config.StateDir and Config.StateRoot, id
	// the worker's id (its marker's).
	configured, root, id string
	log                  zerolog.Logger
	// path is the directory, once Start made or checked it. own is set
	// when Start made it (none was configured): Stop removes it whole,
	// then closes lock, its marker, locked while the worker lives
	// (lockMarker).
	path string
	own  bool
	lock *os.File
	// keep is set when the worker leaves its runs to a successor
	// (Worker.Leave): the run directories in it are theirs, so Stop
	// removes nothing.
	keep atomic.Bool
	// inUse reports whether a container on the engine mounts a path under
	// a directory: a dead worker's state directory is reclaimed only once
	// none does (its runs may be adopted). Nil: none does.
	inUse func(dir string) bool
	// prefix is the prefix of the default state directories' names under
	// root, once prepare made this one there ("" for a configured one).
	prefix string
}

// reclaim removes the state directories dead workers left under the root
// this worker's own is in, once no container mounts anything in them
// (reclaimStateDirs); nothing for a configured state directory. The
// sweeper calls it: a directory kept for its runs goes once they ended.
func (d *stateDir) reclaim() {
	if d.own && d.prefix != "" {
		reclaimStateDirs(d.root, d.prefix, d.inUse, d.log)
	}
}

// Start prepares the state directory (prepare).
func (d *stateDir) Start(context.Context) error { return d.prepare() }

// Stop reclaims the dead workers' state directories no container mounts
// any more (reclaim), then removes what the worker made in its own
// (remove); a worker that leaves its runs to a successor (keep) removes
// nothing. It returns nil.
func (d *stateDir) Stop(context.Context) error {
	if d.keep.Load() {
		if d.lock != nil {
			_ = d.lock.Close()
		}
		return nil
	}
	// A dead worker's directory kept for the runs this one adopted goes
	// now that they ended, not at the next worker's start.
	d.reclaim()
	d.remove()
	return nil
}

// stateRoot returns the root a default state directory is made under and
// the prefix of its name: Config.StateRoot, else DefaultStateRoot when it
// exists or can be made, else os.TempDir().
func (d *stateDir) stateRoot() (root, prefix string) {
	if d.root != "" {
		return d.root, "jetcrew-"
	}
	if err := os.MkdirAll(DefaultStateRoot, 0o755); err == nil {
		if f, err := os.CreateTemp(DefaultStateRoot, ".probe-"); err == nil {
			f.Close()
			_ = os.Remove(f.Name())
			return DefaultStateRoot, "w-"
		}
	}
	return os.TempDir(), "jetcrew-"
}

// prepare makes the worker's state directory and its r/ and p/
// children safe to stage runs in (p/, the pool of run directories,
// emptied). With no StateDir configured it first reclaims the default
// state directories earlier workers of this user left behind
// (reclaimStateDirs), then creates a private one with an unpredictable
// name under stateRoot (os.MkdirTemp, mode 0700) holding its marker,
// locked for the worker's life (lockMarker), and records it: remove
// removes it whole. A configured one, and r/, are created 0700 when missing and
// otherwise must be real directories (not symlinks) owned by the worker's
// user with mode 0700, or the worker refuses to start. Nobody else can
// then create, replace or link anything the worker later creates, chmods
// or mounts under it.
func (d *stateDir) prepare() error {
	d.path = d.configured
	if d.path == "" {
		root, prefix := d.stateRoot()
		d.root, d.prefix = root, prefix
		reclaimStateDirs(root, prefix, d.inUse, d.log)
		dir, err := os.MkdirTemp(root, prefix)
		if err != nil {
			return fmt.Errorf("worker: state dir: %w", err)
		}
		lock, err := lockMarker(dir, d.id)
		if err != nil {
			_ = os.RemoveAll(dir)
			return fmt.Errorf("worker: state dir: %w", err)
		}
		d.path, d.own, d.lock = dir, true, lock
		d.log.Info().Str("state_dir", dir).Msg("state directory made; removed when the worker stops")
	}
	for _, dir := range []string{d.path, filepath.Join(d.path, "r")} {
		if err := privdir.Ensure(dir); err != nil {
			return fmt.Errorf("worker: state dir: %w", err)
		}
	}
	// StateDir/p holds pooled run directories (stage/rundir); what an
	// earlier process of this worker left there is nobody's. (StateDir is
	// checked first: RemoveAll must not follow a planted link.)
	pool := filepath.Join(d.path, "p")
	if err := os.RemoveAll(pool); err != nil {
		return fmt.Errorf("worker: state dir: %w", err)
	}
	if err := privdir.Ensure(pool); err != nil {
		return fmt.Errorf("worker: state dir: %w", err)
	}
	return nil
}

// remove removes, when the worker stops, what it made in its state
// directory: the whole directory when the worker made it (the default),
// else what it staged there (the run and pool directories, the staged
// binaries, the workspace directories and the snapshot cache are gone by
// then; the directory itself is the operator's).
func (d *stateDir) remove() {
	if d.own {
		if err := os.RemoveAll(d.path); err != nil {
			d.log.Warn().Err(err).Str("state_dir", d.path).Msg("remove the state directory")
		}
		// The lock goes once the directory is gone: nobody reclaims it
		// meanwhile.
		_ = d.lock.Close()
		return
	}
	_ = os.RemoveAll(filepath.Join(d.path, "snap"))
}

// reclaimStateDirs removes the state directories under root whose names
// begin with prefix that are provably a dead worker's of this user: a
// directory (not a link) owned by the effective user with mode 0700,
// holding a marker of this user whose lock it takes at once, while it
// removes the directory (markerDead: a locked marker's worker is gone; an
// earlier version's marker, without lock, only when made before the host
// booted). Anything else is left alone: a marker whose lock is held (its
// worker lives, in whatever PID namespace), an unreadable one, a
// directory without one. Each removal is logged, and each earlier
// version's marker left.
func reclaimStateDirs(root, prefix string, inUse func(string) bool, log zerolog.Logger) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	boot := hostBootTime()
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) || !e.IsDir() {
			continue
		}
		dir := filepath.Join(root, e.Name())
		if privdir.Check(dir) == nil {
			reclaimStateDir(dir, boot, inUse, log)
		}
	}
}

// reclaimStateDir removes dir, a candidate of reclaimStateDirs, when its
// marker's lock is free, markerDead says its worker is gone and no
// container mounts anything in it (inUse, asked of dead ones only: a
// run a successor may adopt);
// the lock is held until it is removed.
func reclaimStateDir(dir string, boot time.Time, inUse func(string) bool, log zerolog.Logger) {
	f, locked := openMarker(dir)
	if f == nil {
		return
	}
	defer f.Close()
	if !locked {
		return // its worker lives
	}
	m, ok := readMarker(f)
	if !ok {
		return
	}
	dead, why := markerDead(m, boot)
	if !dead {
		log.Warn().Str("state_dir", dir).Int("pid", m.PID).Time("created", m.Created).
			Msg("leaving a state directory an earlier version of the worker made: whether its worker lives cannot be told; remove it once it is gone")
		return
	}
	if inUse != nil && inUse(dir) {
		log.Info().Str("state_dir", dir).Str("worker", m.Worker).
			Msg("keeping a dead worker's state directory: a container still mounts a run directory in it, for a successor to adopt")
		return
	}
	log.Info().Str("state_dir", dir).Str("worker", m.Worker).Time("created", m.Created).Str("why", why).
		Msg("removing the state directory a dead worker left")
	if err := os.RemoveAll(dir); err != nil {
		log.Warn().Err(err).Str("state_dir", dir).Msg("remove a dead worker's state directory")
	}
}
