package jail

import "time"

// ManagedContainer is a container carrying jetcrew's labels, as seen by
// the reconciler (Runtime.ListManaged).
type ManagedContainer struct {
	// ID is the runtime's container id.
	ID string
	// Name is the container name without a leading '/'.
	Name string
	// State is the runtime's state word: created, running, exited, dead,
	// ...
	State string
	// Labels are the container's labels.
	Labels map[string]string
	// Created is when the container was created.
	Created time.Time
	// Binds are the host paths of its bind mounts (Docker's
	// Mounts[].Source of type bind): a worker keeps a dead worker's state
	// directory while a container still mounts a run directory in it, for
	// a successor to adopt that run.
	Binds []string
}

// ManagedVolume is a volume carrying jetcrew's labels, as seen by the
// reconciler (Runtime.ListManagedVolumes).
type ManagedVolume struct {
	// Name is the volume's name.
	Name string
	// Labels are its labels.
	Labels map[string]string
	// Created is when the engine created it (zero when unknown).
	Created time.Time
}
