package jail

import (
	"errors"
	"time"
)

// Found is what Runtime.Adopt found of a container, read from the engine
// (Docker's container inspect) when it took the container over.
type Found struct {
	// ID is the runtime's id of the container.
	ID string
	// Name is the container name, without a leading '/'.
	Name string
	// ImageID is the runtime's id of the image the container runs
	// ("sha256:…" for Docker); "" when unknown.
	ImageID string
	// Labels are the container's labels (LabelRunID, LabelRole, ...).
	Labels map[string]string
	// Running is true while the process runs (Docker's State.Running: a
	// paused container runs).
	Running bool
	// StartedAt is when the process started (Docker's State.StartedAt);
	// zero for a container that never started.
	StartedAt time.Time
	// Status is how the process ended, when it is not Running.
	Status ExitStatus
	// Mounts are the container's bind mounts (Source the host path) and
	// volume mounts (Volume set, Source the volume's name), with their
	// targets and access; tmpfs mounts are not listed. Their order is the
	// runtime's.
	Mounts []Mount
}

// ErrNotFound is wrapped by the error Runtime.Adopt returns for a
// container that does not exist (any more).
var ErrNotFound = errors.New("container not found")

// ErrNoOutputLog is wrapped by the error Runtime.Adopt returns for a
// container whose output the engine does not keep (its spec had no
// OutputLogBytes: Docker's log driver "none"): what it wrote while no one
// was attached is lost.
var ErrNoOutputLog = errors.New("the engine keeps no output log of the container")

// ErrNotStarted is wrapped by the error Runtime.Adopt returns for a
// container that was created but never started (Docker's state
// "created": the process that made it stopped before starting it).
var ErrNotStarted = errors.New("container was never started")

// ErrDetached is wrapped by the error Container.Wait returns after
// Container.Detach: the exit is no longer followed through that
// Container.
var ErrDetached = errors.New("container was detached")
