package worker

import (
	"context"
	"fmt"
)

// OCIRuntimeLister is implemented by a Runtime that can tell which OCI
// runtimes its engine offers (the Docker runtime's OCIRuntimes reads them
// from the engine's Info: runc, runsc, crun, kata, sysbox, ...). Start uses
// it to refuse a profile naming a runtime the engine lacks; a Runtime that
// does not implement it (the fake of worker/workertest) is not checked.
type OCIRuntimeLister interface {
	// OCIRuntimes returns the names of the engine's OCI runtimes, sorted.
	OCIRuntimes(ctx context.Context) ([]string, error)
}

// checkOCIRuntimes is Start's check that the engine offers every OCI
// runtime the profiles name; nil when the Runtime cannot list them.
func (w *Worker) checkOCIRuntimes(ctx context.Context) error {
	l, ok := w.cfg.Runtime.(OCIRuntimeLister)
	if !ok {
		return nil
	}
	names, err := l.OCIRuntimes(ctx)
	if err != nil {
		return fmt.Errorf("worker: list the engine's OCI runtimes: %w", err)
	}
	if err := w.cfg.Profiles.CheckOCIRuntimes(names); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	w.log.Debug().Strs("oci_runtimes", names).Msg("engine's OCI runtimes")
	return nil
}
