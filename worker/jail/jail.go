// Package jail is the contract between the run engine and a container
// runtime: what a run's container is (ContainerSpec, its mounts, tmpfs and
// volumes, its labels), what a runtime must do with it (Runtime,
// Container), how a container ended (ExitStatus) and what a runtime found
// of a container it took over (Found). The Docker driver (worker/docker)
// and the fake runtime of the tests (worker/workertest) implement it and
// import nothing else of the worker, as Nomad's drivers import only its
// plugins/drivers package.
package jail

import (
	"context"
	"errors"
	"time"
)

// Runtime runs containers for the worker. The Docker implementation is
// worker/docker; tests use a fake (worker/workertest). Implementations must
// be safe for concurrent use.
type Runtime interface {
	// Start creates the container described by spec, attaches to its
	// output, registers a wait for its exit and then starts it, in that
	// order, so that neither output nor exit status can be lost. output is
	// called from one goroutine at a time, in the order the bytes were
	// written, until Container.Wait returns.
	//
	// An error wrapping ErrPermanent means retrying cannot help (for
	// example the image does not exist). When Start fails after creating
	// the container it removes the container before returning.
	Start(ctx context.Context, spec ContainerSpec, output OutputFunc) (Container, error)
	// Adopt takes over the container with the given id that another
	// process (this worker's before a restart, or a dead worker's)
	// started, and returns it with what was found of it. output gets
	// every byte the process wrote since it started, each stream's bytes
	// in order (how the two streams interleave is the engine log's
	// order), then what it writes until it exits; as with Start,
	// Container.Wait returns once the process has exited and every byte
	// has gone to output. A container that has already exited passes its
	// whole output and its Wait returns at once.
	//
	// The engine keeps a container's output only when its spec asked for
	// it (ContainerSpec.OutputLogBytes), and only the last OutputLogBytes
	// of it: past that the oldest part rotates out, and output then
	// starts later than the process's first byte. The caller skips what
	// it already had; Adopt always delivers what the engine kept, from
	// its start.
	//
	// Errors: a container that does not exist wraps ErrNotFound; one that
	// keeps no output log wraps ErrNoOutputLog; one created but never
	// started wraps ErrNotStarted. Those three also wrap ErrPermanent and
	// come with the Found filled in (but for ErrNotFound), so the caller
	// can still judge and remove the container.
	Adopt(ctx context.Context, id string, output OutputFunc) (Container, Found, error)
	// ListManaged returns every container, in any state, that carries the
	// LabelManaged label, for the orphan reconciler.
	ListManaged(ctx context.Context) ([]ManagedContainer, error)
	// Remove force-removes the container with the given id. A container
	// that no longer exists counts as removed.
	Remove(ctx context.Context, id string) error
	// CreateVolume creates the tmpfs volume spec describes (a workspace:
	// the kernel bounds what is written to it, ENOSPC past its size).
	// Containers mount it by name (Mount.Volume). Its content lives while
	// at least one container that mounts it runs: the engine mounts the
	// tmpfs when the first such container starts and unmounts it, its
	// content lost, when the last one stops.
	CreateVolume(ctx context.Context, spec VolumeSpec) error
	// RemoveVolume removes the named volume. A volume that does not exist
	// counts as removed; one still mounted by a container is an error.
	RemoveVolume(ctx context.Context, name string) error
	// ListManagedVolumes returns every volume that carries the
	// LabelManaged label, for the reconciler.
	ListManagedVolumes(ctx context.Context) ([]ManagedVolume, error)
}

// OCIRuntimeLister is implemented by a Runtime that can tell which OCI
// runtimes its engine offers (the Docker runtime reads them from the
// engine's Info: runc, runsc, crun, kata, sysbox, ...). The worker uses it
// at start to refuse a profile naming a runtime the engine lacks; a Runtime
// that does not implement it (the fake of worker/workertest) is not
// checked.
type OCIRuntimeLister interface {
	// OCIRuntimes returns the names of the engine's OCI runtimes, sorted.
	OCIRuntimes(ctx context.Context) ([]string, error)
}

// Container is one started container.
type Container interface {
	// ID returns the runtime's id for the container.
	ID() string
	// ImageID returns the runtime's id of the image the container runs
	// ("sha256:…" for Docker), for the receipt; "" when unknown.
	ImageID() string
	// Wait blocks until the process has exited and every byte of its
	// output has been passed to the OutputFunc, then returns how it
	// exited. It returns ctx.Err() when ctx ends first; the container
	// keeps running.
	Wait(ctx context.Context) (ExitStatus, error)
	// Stop sends SIGTERM to the process and SIGKILL after grace.
	Stop(ctx context.Context, grace time.Duration) error
	// Signal sends the signal sig (a name such as "SIGUSR1") to the
	// container's process, through its init. A container that is not
	// running is an error.
	Signal(ctx context.Context, sig string) error
	// Remove force-removes the container and any volumes it owns.
	Remove(ctx context.Context) error
	// Detach lets go of the container without stopping it, as a worker
	// that leaves its runs running does: output is no longer passed to
	// the OutputFunc (not after Detach returns) and the runtime's own
	// work for the container (its output stream, its exit wait) ends,
	// while the process runs on for Runtime.Adopt to take over. Wait
	// then returns an error wrapping ErrDetached, unless it had already
	// returned the exit status. Stop, Signal and Remove still act on the
	// container. Detach returns ctx.Err() when an OutputFunc call still
	// in progress does not return within ctx.
	Detach(ctx context.Context) error
}

// OutputFunc receives a chunk of a container's output. stream is
// messages.StreamStdout or messages.StreamStderr. p is only valid during
// the call.
type OutputFunc func(stream string, p []byte)

// ExitStatus is how a container's process ended.
type ExitStatus struct {
	// Code is the process exit code (128+signal when a signal ended it).
	Code int
	// OOMKilled is true when the kernel's OOM killer ended the process
	// (Docker's State.OOMKilled).
	OOMKilled bool
	// Error is the runtime's own error message for the exit, if any.
	Error string
}

// ErrPermanent is wrapped by runtime errors that retrying cannot fix: a
// missing image, a refused spec.
var ErrPermanent = errors.New("permanent runtime error")

// ErrImageNotFound is matched (errors.Is) by the error Start returns when
// the spec's image is not on the engine (which never pulls); that error
// wraps ErrPermanent too.
var ErrImageNotFound = errors.New("image not found on the engine")
