package worker

import (
	"context"
	"errors"
	"time"
)

// Runtime runs containers for the worker. The Docker implementation is
// worker/docker; tests use a fake (worker/workertest). Implementations must be
// safe for concurrent use.
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

// VolumeSpec describes a tmpfs volume (Runtime.CreateVolume).
type VolumeSpec struct {
	// Name is the volume's name, unique per delivery.
	Name string
	// SizeBytes is the tmpfs size in bytes (its size= option).
	SizeBytes int64
	// UID and GID own the volume's root directory (mode 0755).
	UID, GID int
	// Inodes bounds the files and directories it can hold (the tmpfs
	// nr_inodes option); 0 leaves the kernel's default (half the RAM's
	// pages).
	Inodes int64
	// Labels are set on the volume (LabelManaged, LabelRunID, ...).
	Labels map[string]string
}

// ManagedVolume is a volume as the reconciler sees it.
type ManagedVolume struct {
	// Name is the volume's name.
	Name string
	// Labels are its labels.
	Labels map[string]string
	// Created is when the engine created it (zero when unknown).
	Created time.Time
}

// Container is one started container.
type Container interface {
	// ID returns the runtime's id for the container.
	ID() string
	// ImageID returns the runtime's id of the image the container runs
	// ("sha256:…" for Docker), for the receipt; "" when unknown.
	ImageID() string
	// Wait blocks until the process has exited and every byte of its output
	// has been passed to the OutputFunc, then returns how it exited. It
	// returns ctx.Err() when ctx ends first; the container keeps running.
	Wait(ctx context.Context) (ExitStatus, error)
	// Stop sends SIGTERM to the process and SIGKILL after grace.
	Stop(ctx context.Context, grace time.Duration) error
	// Signal sends the signal sig (a name such as "SIGUSR1") to the
	// container's process, through its init. A container that is not
	// running is an error.
	Signal(ctx context.Context, sig string) error
	// Remove force-removes the container and any volumes it owns.
	Remove(ctx context.Context) error
}

// OutputFunc receives a chunk of a container's output. stream is
// messages.StreamStdout or messages.StreamStderr. p is only valid during the
// call.
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

// ManagedContainer is a container carrying jetcrew's labels, as seen by the
// reconciler.
type ManagedContainer struct {
	// ID is the runtime's container id.
	ID string
	// Name is the container name without a leading '/'.
	Name string
	// State is the runtime's state word: created, running, exited, dead, ...
	State string
	// Labels are the container's labels.
	Labels map[string]string
	// Created is when the container was created.
	Created time.Time
}

// ErrPermanent is wrapped by runtime errors that retrying cannot fix: a
// missing image, a refused spec.
var ErrPermanent = errors.New("permanent runtime error")

// Labels set on every run container. Keys are reverse-DNS, as Docker
// recommends for labels.
const (
	// LabelManaged marks a container as jetcrew's; its value is "true".
	LabelManaged = "io.jetcrew.managed"
	// LabelRunID carries the run id.
	LabelRunID = "io.jetcrew.run-id"
	// LabelWorker carries the id of the worker that created the container.
	LabelWorker = "io.jetcrew.worker"
	// LabelAttempt carries the delivery number the container belongs to.
	LabelAttempt = "io.jetcrew.attempt"
	// LabelCreated carries the creation time, RFC 3339 with nanoseconds.
	LabelCreated = "io.jetcrew.created"
	// LabelProfile carries the profile name.
	LabelProfile = "io.jetcrew.profile"
	// LabelInstall identifies the jetcrew installation (the JETCREW_RUNS
	// stream, by its creation time) that owns the container, so workers of
	// two installations sharing one Docker engine never reap each other's
	// containers.
	LabelInstall = "io.jetcrew.install"
	// LabelRole says what a container or volume is to its run: RoleRun,
	// RoleCapture, RoleWorkspace or RoleEgressProof. Operators filter on
	// it (`docker ps --filter label=io.jetcrew.role=capture`); the
	// reconciler treats every role alike.
	LabelRole = "io.jetcrew.role"
)

// Values of LabelRole.
const (
	// RoleRun is the run's own container, the one the agent runs in.
	RoleRun = "run"
	// RoleCapture is a workspace run's capture container, which holds the
	// workspace volume from staging to the capture (docs/workspaces.md).
	RoleCapture = "capture"
	// RoleWorkspace is a workspace run's tmpfs volume.
	RoleWorkspace = "workspace"
	// RoleEgressProof is the container a worker starts at start-up to
	// prove its egress rules (egressproof.go).
	RoleEgressProof = "egress-proof"
)

// ContainerSpec is a runtime-neutral description of one run container. The
// worker builds it from a profile and a run request (see BuildSpec); a
// Runtime turns it into its own configuration.
type ContainerSpec struct {
	// Name is the container name, unique per run and delivery
	// ("jetcrew-<run id>-<attempt>"): a second container for the same
	// delivery cannot be created.
	Name string
	// Image is the image reference.
	Image string
	// Cmd is the process argv.
	Cmd []string
	// Env holds KEY=VALUE entries.
	Env []string
	// User is "uid:gid", numeric. Never root.
	User string
	// WorkingDir is the process's working directory.
	WorkingDir string
	// Labels are set on the container.
	Labels map[string]string
	// Network is "none", "bridge" or the name of a Docker network.
	Network string
	// OCIRuntime names the OCI runtime ("runc", "runsc", "crun", ...: any
	// the engine offers); empty means the engine's default.
	OCIRuntime string
	// MemoryBytes is the memory limit in bytes (swap is disabled: the swap
	// limit equals it).
	MemoryBytes int64
	// NanoCPUs is the CPU limit in billionths of a CPU.
	NanoCPUs int64
	// PidsLimit is the most processes and threads the container may have.
	PidsLimit int64
	// Tmpfs maps a container path to the options of a tmpfs mounted there
	// ("size=64m,mode=1777").
	Tmpfs map[string]string
	// Mounts are typed bind and volume mounts. A missing source is an
	// error.
	Mounts []Mount
}

// Mount is a bind mount of a host path, or a mount of a volume, into a
// container.
type Mount struct {
	// Source is the host path, which must exist; or, with Volume, the name
	// of a volume made by Runtime.CreateVolume.
	Source string
	// Volume makes Source a volume name (mounted without copying the
	// image's content at Target into it).
	Volume bool `json:",omitempty"`
	// VolumeSpec, for a volume mount, is the volume's spec: should the
	// volume be missing when the container is created, the engine creates
	// it so, never as an unbounded directory of its disk.
	VolumeSpec *VolumeSpec `json:",omitempty"`
	// Target is the path in the container.
	Target string
	// ReadOnly mounts it read-only.
	ReadOnly bool
}
