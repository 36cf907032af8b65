package worker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// prepareStateDir makes the worker's state directory and its r/ and p/
// children safe to stage runs in (p/, the pool of run directories, emptied): with no StateDir configured it creates a private one with
// an unpredictable name under os.TempDir() (os.MkdirTemp, mode 0700) and
// records it; a configured one, and r/, are created 0700 when missing and
// otherwise must be real directories (not symlinks) owned by the worker's
// user with mode 0700, or the worker refuses to start. Nobody else can then
// create, replace or link anything the worker later creates, chmods or
// mounts under it.
func (w *Worker) prepareStateDir() error {
	if w.cfg.StateDir == "" {
		dir, err := os.MkdirTemp("", "jetcrew-")
		if err != nil {
			return fmt.Errorf("worker: state dir: %w", err)
		}
		w.cfg.StateDir = dir
	}
	if w.bridges != nil {
		// New had no state dir to put the staged bridges under.
		w.bridges.dir = filepath.Join(w.cfg.StateDir, "bin")
	}
	if w.tools != nil {
		w.tools.dir = filepath.Join(w.cfg.StateDir, "tool")
	}
	for _, dir := range []string{w.cfg.StateDir, filepath.Join(w.cfg.StateDir, "r")} {
		if err := ensurePrivateDir(dir); err != nil {
			return fmt.Errorf("worker: state dir: %w", err)
		}
	}
	// StateDir/p holds pooled run directories (rundirpool.go); what an
	// earlier process of this worker left there is nobody's. (StateDir is
	// checked first: RemoveAll must not follow a planted link.)
	pool := filepath.Join(w.cfg.StateDir, "p")
	if err := os.RemoveAll(pool); err != nil {
		return fmt.Errorf("worker: state dir: %w", err)
	}
	if err := ensurePrivateDir(pool); err != nil {
		return fmt.Errorf("worker: state dir: %w", err)
	}
	w.runDirs = newRunDirPool(pool, w.cfg.Concurrency)
	return nil
}

// ensurePrivateDir creates dir with mode 0700, or checks that the existing
// dir is a directory (not a symlink), owned by the effective user, with mode
// 0700 exactly.
func ensurePrivateDir(dir string) error {
	err := os.Mkdir(dir, 0o700)
	switch {
	case err == nil:
		// Mkdir's mode passes through the umask; 0700 only loses bits.
		return checkPrivateDir(dir)
	case errors.Is(err, os.ErrExist):
		return checkPrivateDir(dir)
	default:
		return err
	}
}

// checkPrivateDir is ensurePrivateDir's check of an existing directory.
func checkPrivateDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("%s is a symbolic link; refusing it (the worker never follows links in its state dir)", dir)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is owned by uid %d, not by the worker's uid %d; refusing a directory someone else created (remove it, or choose another state dir)", dir, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm() != 0o700 {
		return fmt.Errorf("%s has mode %04o; the worker's state dir must have mode 0700 (chmod 0700 it, or choose another state dir)", dir, fi.Mode().Perm())
	}
	return nil
}
