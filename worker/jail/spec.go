package jail

import (
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"
)

// ContainerSpec is a runtime-neutral description of one container. The
// run engine builds it from a profile and a run request; a Runtime turns
// it into its own configuration (the Docker driver into container.Config,
// HostConfig and mounts) and adds the hardening every container gets.
type ContainerSpec struct {
	// Name is the container name (ContainerName for a run's container):
	// unique per run and delivery, so a second container for the same
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
	// Tmpfs are the tmpfs file systems mounted in the container.
	Tmpfs TmpfsMounts
	// Mounts are typed bind and volume mounts. A missing source is an
	// error.
	Mounts []Mount
	// OutputLogBytes is the most bytes of the container's output (stdout
	// and stderr together) the engine keeps, so that Runtime.Adopt can
	// read what the process wrote while no worker was attached. Past it
	// the oldest part rotates out. The bound counts the engine's framing
	// too (Docker's local log driver: some 20 to 30 bytes a line), so a
	// little less output fits. Zero keeps none (Docker's log driver
	// "none"): what no one reads is discarded, and the container cannot
	// be adopted. A run's container and a warm one (which becomes a
	// run's) set it alike; DefaultOutputLogBytes is a sane value.
	OutputLogBytes int64
}

// DefaultOutputLogBytes is a sane ContainerSpec.OutputLogBytes for a run's
// container: 64 MiB of engine disk at most.
const DefaultOutputLogBytes = 64 << 20

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

// Tmpfs is a tmpfs file system mounted in a container: memory the kernel
// bounds, charged to the container's memory limit, gone with the
// container.
type Tmpfs struct {
	// Target is the absolute path in the container.
	Target string
	// SizeBytes is the most bytes it holds (the tmpfs size= option); past
	// it a write fails with ENOSPC. Must be positive.
	SizeBytes int64
	// Mode is the permission bits of its root directory, as chmod takes
	// them (octal 01777 for a sticky, world-writable /tmp; 0700 for a
	// home).
	Mode uint32
	// UID and GID own its root directory; 0 leaves root as the owner (the
	// engine's default).
	UID, GID int
}

// Options returns t's mount options as the Docker Engine's HostConfig.Tmpfs
// takes them: "size=<n>m" (or bytes when not a whole number of MiB),
// "mode=<octal>", then "uid=" and "gid=" when set.
func (t Tmpfs) Options() string {
	var b strings.Builder
	b.WriteString("size=")
	if t.SizeBytes%(1<<20) == 0 {
		b.WriteString(strconv.FormatInt(t.SizeBytes>>20, 10))
		b.WriteString("m")
	} else {
		b.WriteString(strconv.FormatInt(t.SizeBytes, 10))
	}
	fmt.Fprintf(&b, ",mode=%04o", t.Mode)
	if t.UID != 0 || t.GID != 0 {
		fmt.Fprintf(&b, ",uid=%d,gid=%d", t.UID, t.GID)
	}
	return b.String()
}

// Validate returns an error when t cannot be mounted as described: a
// relative target or the root, a size that is not positive, mode bits
// beyond 07777, a negative owner.
func (t Tmpfs) Validate() error {
	switch {
	case !path.IsAbs(t.Target) || path.Clean(t.Target) == "/":
		return fmt.Errorf("tmpfs target %q must be an absolute path other than /", t.Target)
	case t.SizeBytes <= 0:
		return fmt.Errorf("tmpfs %s: size %d bytes must be positive", t.Target, t.SizeBytes)
	case t.Mode > 0o7777:
		return fmt.Errorf("tmpfs %s: mode %o has bits beyond 07777", t.Target, t.Mode)
	case t.UID < 0 || t.GID < 0:
		return fmt.Errorf("tmpfs %s: owner %d:%d is negative", t.Target, t.UID, t.GID)
	}
	return nil
}

// TmpfsMounts are a container's tmpfs file systems. Its JSON form is the
// object of target to Options, as a receipt shows them.
type TmpfsMounts []Tmpfs

// Options returns the mounts as HostConfig.Tmpfs takes them: target to
// Options; nil when there are none.
func (ts TmpfsMounts) Options() map[string]string {
	if len(ts) == 0 {
		return nil
	}
	m := make(map[string]string, len(ts))
	for _, t := range ts {
		m[t.Target] = t.Options()
	}
	return m
}

// Get returns the tmpfs mounted at target, and whether there is one.
func (ts TmpfsMounts) Get(target string) (Tmpfs, bool) {
	for _, t := range ts {
		if t.Target == target {
			return t, true
		}
	}
	return Tmpfs{}, false
}

// MarshalJSON encodes the mounts as Options does: {"<target>":
// "<options>", ...}, keys sorted.
func (ts TmpfsMounts) MarshalJSON() ([]byte, error) {
	if ts == nil {
		return []byte("null"), nil
	}
	return json.Marshal(ts.Options())
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
