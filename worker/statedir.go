package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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

// stateMarker is the file a worker writes in a state directory it made:
// which process holds it. A later worker of the same user reclaims a
// directory whose process is gone (reclaimStateDirs).
const stateMarker = ".jetcrew-worker"

// marker is the content of stateMarker.
type marker struct {
	// PID is the process that made the directory; Start its start time
	// (field 22 of /proc/<pid>/stat, in clock ticks since boot), so a pid
	// reused by another process does not count as the worker.
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
	// Created is when the directory was made.
	Created time.Time `json:"created"`
}

// stateRoot returns the root a default state directory is made under and
// the prefix of its name: Config.StateRoot, else DefaultStateRoot when it
// exists or can be made, else os.TempDir().
func (w *Worker) stateRoot() (root, prefix string) {
	if w.cfg.StateRoot != "" {
		return w.cfg.StateRoot, "jetcrew-"
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

// prepareStateDir makes the worker's state directory and its r/ and p/
// children safe to stage runs in (p/, the pool of run directories,
// emptied). With no StateDir configured it first reclaims the default
// state directories earlier workers of this user left behind
// (reclaimStateDirs), then creates a private one with an unpredictable
// name under stateRoot (os.MkdirTemp, mode 0700) holding its marker, and
// records it: Stop removes it whole. A configured one, and r/, are created
// 0700 when missing and otherwise must be real directories (not symlinks)
// owned by the worker's user with mode 0700, or the worker refuses to
// start. Nobody else can then create, replace or link anything the worker
// later creates, chmods or mounts under it.
func (w *Worker) prepareStateDir() error {
	if w.cfg.StateDir == "" {
		root, prefix := w.stateRoot()
		reclaimStateDirs(root, prefix, w.log)
		dir, err := os.MkdirTemp(root, prefix)
		if err != nil {
			return fmt.Errorf("worker: state dir: %w", err)
		}
		if err := writeMarker(dir); err != nil {
			_ = os.RemoveAll(dir)
			return fmt.Errorf("worker: state dir: %w", err)
		}
		w.cfg.StateDir, w.ownStateDir = dir, true
		w.log.Info().Str("state_dir", dir).Msg("state directory made; removed when the worker stops")
	}
	for _, dir := range []string{w.cfg.StateDir, filepath.Join(w.cfg.StateDir, "r")} {
		if err := privdir.Ensure(dir); err != nil {
			return fmt.Errorf("worker: state dir: %w", err)
		}
	}
	// StateDir/p holds pooled run directories (stage/rundir); what an
	// earlier process of this worker left there is nobody's. (StateDir is
	// checked first: RemoveAll must not follow a planted link.)
	pool := filepath.Join(w.cfg.StateDir, "p")
	if err := os.RemoveAll(pool); err != nil {
		return fmt.Errorf("worker: state dir: %w", err)
	}
	if err := privdir.Ensure(pool); err != nil {
		return fmt.Errorf("worker: state dir: %w", err)
	}
	return nil
}

// removeStateDir removes, when the worker stops, what it made in its state
// directory: the whole directory when the worker made it (the default),
// else what it staged there (the run and pool directories, the staged
// binaries, the workspace directories and the snapshot cache are gone by
// then; the directory itself is the operator's).
func (w *Worker) removeStateDir() {
	if w.ownStateDir {
		if err := os.RemoveAll(w.cfg.StateDir); err != nil {
			w.log.Warn().Err(err).Str("state_dir", w.cfg.StateDir).Msg("remove the state directory")
		}
		return
	}
	_ = os.RemoveAll(filepath.Join(w.cfg.StateDir, "snap"))
}

// writeMarker writes stateMarker into dir, mode 0600: this process.
func writeMarker(dir string) error {
	start, err := processStart(os.Getpid())
	if err != nil {
		return err
	}
	b, _ := json.Marshal(marker{PID: os.Getpid(), Start: start, Created: time.Now().UTC()})
	return os.WriteFile(filepath.Join(dir, stateMarker), b, 0o600)
}

// processStart returns the start time of process pid, in clock ticks since
// boot (field 22 of /proc/<pid>/stat); an error when it does not exist.
func processStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	rest := string(b)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 {
		rest = rest[i+1:]
	}
	fields := strings.Fields(rest)
	if len(fields) < 20 {
		return 0, errors.New("short /proc stat")
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// reclaimStateDirs removes the state directories under root whose names
// begin with prefix that are provably a dead worker's of this user: a
// directory (not a link) owned by the effective user with mode 0700,
// holding a marker of this user whose process is gone (or whose pid now
// names another process). Anything else is left alone. Each removal is
// logged.
func reclaimStateDirs(root, prefix string, log zerolog.Logger) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) || !e.IsDir() {
			continue
		}
		dir := filepath.Join(root, e.Name())
		if privdir.Check(dir) != nil {
			continue
		}
		m, ok := readMarker(dir)
		if !ok {
			continue
		}
		if start, err := processStart(m.PID); err == nil && start == m.Start {
			continue // its worker lives
		}
		log.Info().Str("state_dir", dir).Int("pid", m.PID).Time("created", m.Created).
			Msg("removing the state directory a dead worker left")
		if err := os.RemoveAll(dir); err != nil {
			log.Warn().Err(err).Str("state_dir", dir).Msg("remove a dead worker's state directory")
		}
	}
}

// readMarker reads dir's marker: a regular file of the effective user.
func readMarker(dir string) (marker, bool) {
	path := filepath.Join(dir, stateMarker)
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() > 4096 {
		return marker{}, false
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
		return marker{}, false
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return marker{}, false
	}
	var m marker
	if json.Unmarshal(b, &m) != nil || m.PID <= 0 {
		return marker{}, false
	}
	return m, true
}
