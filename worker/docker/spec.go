package docker

import (
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/jetcrew/jetcrew/worker/jail"
)

// minMemoryBytes is the smallest memory limit the Docker Engine accepts
// (linuxMinMemory in the daemon: 6 MiB).
const minMemoryBytes = 6 << 20

// defaultNetwork is the network mode used when the spec names none.
const defaultNetwork = "none"

// validName is the Docker Engine's rule for container names.
var validName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]+$`)

// containerConfig translates spec into the Engine API's create request. It
// is pure: it calls neither the daemon nor the file system (Start checks that
// bind sources exist). It refuses a spec that would weaken the sandbox, with
// an error wrapping jail.ErrPermanent that lists every problem found.
//
// The hardening is not configurable: ReadonlyRootfs, CapDrop ALL,
// no-new-privileges, Init (tini as PID 1, which forwards signals and reaps
// zombies), no TTY and no stdin, MemorySwap equal to Memory (no swap), a
// pids limit, an open-file limit (RunNofile), a private IPC namespace and
// AutoRemove off (the exit status is read by inspecting the exited
// container). The engine keeps at most the spec's OutputLogBytes of the
// output (runLogConfig: log driver "local", or "none" for 0). The label
// jail.LabelManaged is always set to "true", so the reconciler sees every
// container made here.
func containerConfig(spec jail.ContainerSpec) (*container.Config, *container.HostConfig, *network.NetworkingConfig, error) {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	if !validName.MatchString(spec.Name) {
		bad("name %q must match %s", spec.Name, validName)
	}
	if spec.Image == "" {
		bad("image is empty")
	}
	if len(spec.Cmd) == 0 {
		bad("cmd is empty")
	}
	if err := checkUser(spec.User); err != nil {
		bad("%v", err)
	}
	for _, kv := range spec.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			bad("env entry %q is not KEY=VALUE", kv)
		}
	}
	if spec.WorkingDir != "" && !path.IsAbs(spec.WorkingDir) {
		bad("working dir %q is not absolute", spec.WorkingDir)
	}

	netMode := spec.Network
	if netMode == "" {
		netMode = defaultNetwork
	}
	if netMode == "host" || strings.HasPrefix(netMode, "container:") {
		bad("network %q shares a namespace with the host or another container", netMode)
	}

	if spec.MemoryBytes < minMemoryBytes {
		bad("memory limit %d bytes is below the engine's minimum of %d", spec.MemoryBytes, minMemoryBytes)
	}
	if spec.PidsLimit <= 0 {
		bad("pids limit %d must be positive", spec.PidsLimit)
	}
	if spec.NanoCPUs < 0 {
		bad("cpu limit %d must not be negative", spec.NanoCPUs)
	}
	if spec.OutputLogBytes < 0 {
		bad("output log bound %d bytes must not be negative", spec.OutputLogBytes)
	}

	mounts := checkMounts(spec, bad)
	if len(problems) > 0 {
		return nil, nil, nil, fmt.Errorf("invalid container spec %q: %s: %w", spec.Name, strings.Join(problems, "; "), jail.ErrPermanent)
	}

	cfg, host := engineConfig(spec, netMode, mounts)
	return cfg, host, &network.NetworkingConfig{}, nil
}

// engineConfig builds the engine's container and host configuration of a
// checked spec, with the hardening containerConfig describes.
func engineConfig(spec jail.ContainerSpec, netMode string, mounts []mount.Mount) (*container.Config, *container.HostConfig) {
	labels := make(map[string]string, len(spec.Labels)+1)
	maps.Copy(labels, spec.Labels)
	labels[jail.LabelManaged] = "true"

	pids := spec.PidsLimit
	init := true
	cfg := &container.Config{
		Image:        spec.Image,
		Cmd:          slices.Clone(spec.Cmd),
		Env:          slices.Clone(spec.Env),
		User:         spec.User,
		WorkingDir:   spec.WorkingDir,
		Labels:       labels,
		AttachStdout: true,
		AttachStderr: true,
		Tty:          false,
		OpenStdin:    false,
		StdinOnce:    false,
		// Explicit, so an image's STOPSIGNAL cannot change what Stop sends.
		StopSignal: "SIGTERM",
	}
	host := &container.HostConfig{
		NetworkMode:    container.NetworkMode(netMode),
		Runtime:        spec.OCIRuntime,
		ReadonlyRootfs: true,
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges:true"},
		Init:           &init,
		IpcMode:        container.IPCModePrivate,
		AutoRemove:     false,
		Tmpfs:          spec.Tmpfs.Options(),
		Mounts:         mounts,
		Resources: container.Resources{
			Memory:     spec.MemoryBytes,
			MemorySwap: spec.MemoryBytes,
			NanoCPUs:   spec.NanoCPUs,
			PidsLimit:  &pids,
			Ulimits:    runUlimits(),
		},
		LogConfig: runLogConfig(spec.OutputLogBytes),
	}
	return cfg, host
}

// volumeName is what the engine accepts as a volume's name (moby's
// volume/local validName).
var volumeName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]+$`)

// checkMounts checks the spec's tmpfs, bind and volume mounts (absolute
// targets, none at / nor twice, valid tmpfs options, absolute bind
// sources, valid volume names), calling bad for each problem, and returns
// the bind and volume mounts for the engine.
func checkMounts(spec jail.ContainerSpec, bad func(format string, args ...any)) []mount.Mount {
	targets := make(map[string]bool)
	target := func(kind, p string) {
		switch {
		case !path.IsAbs(p):
			bad("%s target %q is not absolute", kind, p)
		case path.Clean(p) == "/":
			bad("%s target %q would hide the root file system", kind, p)
		case targets[path.Clean(p)]:
			bad("%s target %q is mounted twice", kind, p)
		}
		targets[path.Clean(p)] = true
	}
	for _, t := range spec.Tmpfs {
		target("tmpfs", t.Target)
		if err := t.Validate(); err != nil && path.IsAbs(t.Target) && path.Clean(t.Target) != "/" {
			bad("%v", err)
		}
	}
	mounts := make([]mount.Mount, 0, len(spec.Mounts))
	for _, m := range spec.Mounts {
		if m.Volume {
			if !volumeName.MatchString(m.Source) {
				bad("volume name %q is not a valid volume name", m.Source)
			}
			target("volume", m.Target)
			// NoCopy: the volume starts empty, never filled from the
			// image's content at Target. With its spec, a volume the
			// engine finds missing is created as the same bounded tmpfs.
			opts := &mount.VolumeOptions{NoCopy: true}
			if vs := m.VolumeSpec; vs != nil {
				opts.Labels = vs.Labels
				opts.DriverConfig = &mount.Driver{Name: "local", Options: tmpfsOptions(*vs)}
			}
			mounts = append(mounts, mount.Mount{Type: mount.TypeVolume, Source: m.Source, Target: m.Target,
				ReadOnly: m.ReadOnly, VolumeOptions: opts})
			continue
		}
		if !path.IsAbs(m.Source) {
			bad("bind source %q is not absolute", m.Source)
		}
		target("bind", m.Target)
		mounts = append(mounts, mount.Mount{
			Type:     mount.TypeBind,
			Source:   m.Source,
			Target:   m.Target,
			ReadOnly: m.ReadOnly,
			// A missing source is an error, never an empty directory
			// created for us. (CreateMountpoint is API 1.44+; older
			// engines refuse typed binds with a missing source anyway.)
			BindOptions: &mount.BindOptions{CreateMountpoint: false},
		})
	}

	return mounts
}

// checkUser accepts only "uid:gid" with both numeric and neither 0. A missing
// gid is refused because Docker would then take the group from the image's
// /etc/passwd, or use 0 when the uid has no entry there.
func checkUser(user string) error {
	if user == "" {
		return fmt.Errorf("user is empty (want uid:gid)")
	}
	uid, gid, ok := strings.Cut(user, ":")
	if uid == "root" || uid == "0" {
		return fmt.Errorf("user %q is root", user)
	}
	if !ok {
		return fmt.Errorf("user %q has no group (want uid:gid)", user)
	}
	u, uerr := strconv.ParseUint(uid, 10, 32)
	g, gerr := strconv.ParseUint(gid, 10, 32)
	switch {
	case uerr != nil || gerr != nil:
		return fmt.Errorf("user %q is not numeric uid:gid", user)
	case u == 0:
		return fmt.Errorf("user %q is root", user)
	case g == 0:
		return fmt.Errorf("user %q has the root group", user)
	}
	return nil
}
