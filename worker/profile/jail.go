package profile

import (
	"cmp"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// JailConfig is the profile facet a run's container is made from.
//
// The runner's container spec (runner.ProfileSpec) and the warm pool read
// it; every key here is one a warm container is made with
// (warm.Bindings), workdir aside.
type JailConfig struct {
	// Image is the image reference. It must exist on the worker's Docker
	// engine; it is never pulled.
	Image string `toml:"image" json:"image"`
	// User is "uid:gid", numeric and never 0. Default "65532:65532".
	User string `toml:"user" json:"user"`
	// Home is the writable home directory in the container (a tmpfs owned
	// by User). Default "/home/agent".
	Home string `toml:"home" json:"home"`
	// WorkDir is the working directory. Default: Home.
	WorkDir string `toml:"workdir" json:"workdir"`
	// Network is "none" (default), "bridge" or the name of a Docker network
	// the operator created. A profile with Egress keeps "none": its only way
	// out is its egress proxy.
	Network string `toml:"network" json:"network"`
	// Runtime is the OCI runtime, any name the engine reports (`docker
	// info` Runtimes): runc (the engine's default when empty), runsc
	// (gVisor), crun, kata, sysbox-runc, ... The worker refuses to start
	// when the engine lacks a profile's runtime (docs/jail.md).
	Runtime string `toml:"runtime" json:"runtime"`
	// MemoryMiB is the memory limit in MiB (no swap). Default 512.
	MemoryMiB int64 `toml:"memory_mib" json:"memory_mib"`
	// CPUs is the CPU limit in CPUs (1.5 = one and a half). Default 1.
	CPUs float64 `toml:"cpus" json:"cpus"`
	// Pids is the process and thread limit. Default 256.
	Pids int64 `toml:"pids" json:"pids"`
	// TmpMiB is the size of the tmpfs at /tmp, in MiB. Default 64.
	TmpMiB int64 `toml:"tmp_mib" json:"tmp_mib"`
	// HomeMiB is the size of the tmpfs at Home, in MiB. Default 64.
	HomeMiB int64 `toml:"home_mib" json:"home_mib"`
}

// Jail defaults, and the built-in shell profile's image.
const (
	DefaultUser      = "65532:65532"
	DefaultHome      = "/home/agent"
	DefaultMemoryMiB = 512
	DefaultCPUs      = 1.0
	DefaultPids      = 256
	DefaultTmpMiB    = 64
	DefaultHomeMiB   = 64
	// SandboxImage is the image of the built-in shell profile, built by
	// `make images` from Debian's busybox-static.
	SandboxImage = "jetcrew-sandbox:latest"
)

// MaxID is the largest uid or gid a profile's user may name: the largest
// positive 32-bit signed value, which every runtime (runc, gVisor) and every
// image tool carries; larger ids fail only when a run starts.
const MaxID = 1<<31 - 1

// HomePrefixes are the directories a profile's home (and workdir) must be
// at or under: a writable tmpfs is mounted at home, and mounted over a
// system directory (/etc, /usr, /bin, ...) it would let the run replace what
// the image's programs trust.
var HomePrefixes = []string{"/home", "/work", "/workspace"}

// resolve applies the jail's defaults; workdir defaults to home.
func (j *JailConfig) resolve() {
	j.User, j.Home, j.Network = cmp.Or(j.User, DefaultUser), cmp.Or(j.Home, DefaultHome), cmp.Or(j.Network, "none")
	j.WorkDir = cmp.Or(j.WorkDir, j.Home)
	j.MemoryMiB, j.CPUs, j.Pids = cmp.Or(j.MemoryMiB, DefaultMemoryMiB), cmp.Or(j.CPUs, DefaultCPUs), cmp.Or(j.Pids, DefaultPids)
	j.TmpMiB, j.HomeMiB = cmp.Or(j.TmpMiB, DefaultTmpMiB), cmp.Or(j.HomeMiB, DefaultHomeMiB)
}

// validate checks the jail, defaults applied: an image, a user that is not
// root, a home and workdir under HomePrefixes, a network that shares no
// namespace, a runtime name and limits a run can live in.
func (j JailConfig) validate() error {
	if j.Image == "" {
		return errors.New("image is required")
	}
	uid, gid, err := parseUser(j.User)
	if err != nil {
		return err
	}
	if uid > MaxID || gid > MaxID {
		return fmt.Errorf("user %q: uid and gid must be 1 to %d", j.User, MaxID)
	}
	if !strings.HasPrefix(j.Home, "/") || !strings.HasPrefix(j.WorkDir, "/") {
		return errors.New("home and workdir must be absolute paths")
	}
	if j.Home == "/tmp" || strings.HasPrefix(j.Home, "/tmp/") {
		return errors.New("home must not be under /tmp (it has its own tmpfs)")
	}
	for _, d := range []struct{ key, path string }{{"home", j.Home}, {"workdir", j.WorkDir}} {
		if !underHomePrefixes(d.path) {
			return fmt.Errorf("%s %q must be at or under one of %s", d.key, d.path, strings.Join(HomePrefixes, ", "))
		}
	}
	if j.Network == "host" || strings.HasPrefix(j.Network, "container:") {
		return fmt.Errorf("network %q would share a namespace with the host or another container; use none, bridge or a named network", j.Network)
	}
	if j.Runtime != "" && !validRuntimeName(j.Runtime) {
		return fmt.Errorf("runtime %q is not a runtime name (letters, digits, '.', '-', '_'; at most 64)", j.Runtime)
	}
	if j.MemoryMiB < 6 || j.CPUs <= 0 || j.Pids < 8 || j.TmpMiB < 1 || j.HomeMiB < 1 {
		return errors.New("limits too small: memory_mib >= 6, cpus > 0, pids >= 8, tmp_mib >= 1, home_mib >= 1")
	}
	return nil
}

// Owner returns the numeric uid and gid of the profile's user.
// The user key was validated when the profile was resolved.
func (j JailConfig) Owner() (uid, gid int) {
	uid, gid, _ = parseUser(j.User)
	return uid, gid
}

// parseUser parses "uid:gid" (numeric) and refuses root.
func parseUser(s string) (uid, gid int, err error) {
	u, g, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, fmt.Errorf("user %q must be numeric uid:gid", s)
	}
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if err1 != nil || err2 != nil || uid < 0 || gid < 0 {
		return 0, 0, fmt.Errorf("user %q must be numeric uid:gid", s)
	}
	if uid == 0 || gid == 0 {
		return 0, 0, fmt.Errorf("user %q: runs never run as root (uid or gid 0)", s)
	}
	return uid, gid, nil
}

// underHomePrefixes reports whether path, cleaned of "." and ".." steps, is
// one of HomePrefixes or under one.
func underHomePrefixes(path string) bool {
	if strings.Contains("/"+path+"/", "/../") || strings.Contains("/"+path+"/", "/./") || strings.Contains(path, "//") {
		return false
	}
	path = strings.TrimSuffix(path, "/")
	for _, pre := range HomePrefixes {
		if path == pre || strings.HasPrefix(path, pre+"/") {
			return true
		}
	}
	return false
}
