package worker

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/jetcrew/jetcrew/worker/internal/privdir"
)

// prepareStateDir makes the worker's state directory and its r/ and p/
// children safe to stage runs in (p/, the pool of run directories,
// emptied): with no StateDir configured it creates a private one with
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
	for _, dir := range []string{w.cfg.StateDir, filepath.Join(w.cfg.StateDir, "r")} {
		if err := privdir.Ensure(dir); err != nil {
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
	if err := privdir.Ensure(pool); err != nil {
		return fmt.Errorf("worker: state dir: %w", err)
	}
	return nil
}
