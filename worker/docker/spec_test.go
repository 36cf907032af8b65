package docker

import (
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/stretchr/testify/require"
)

// validSpec returns a spec containerConfig accepts.
func validSpec() jail.ContainerSpec {
	return jail.ContainerSpec{
		Name:        "jetcrew-01J0000000000000000000000-1",
		Image:       "jetcrew-sandbox:latest",
		Cmd:         []string{"sh", "-c", "echo hi"},
		Env:         []string{"HOME=/home/agent", "EMPTY="},
		User:        "65532:65532",
		WorkingDir:  "/home/agent",
		Labels:      map[string]string{jail.LabelRunID: "r1"},
		MemoryBytes: 256 << 20,
		NanoCPUs:    1e9,
		PidsLimit:   64,
		Tmpfs:       jail.TmpfsMounts{{Target: "/tmp", SizeBytes: 16 << 20, Mode: 0o1777}},
		Mounts:      []jail.Mount{{Source: "/srv/repo", Target: "/work", ReadOnly: true}},
	}
}

func TestContainerConfigHardening(t *testing.T) {
	t.Parallel()

	spec := validSpec()
	cfg, host, netCfg, err := containerConfig(spec)
	require.NoError(t, err)
	require.NotNil(t, netCfg)

	require.Equal(t, "jetcrew-sandbox:latest", cfg.Image)
	require.Equal(t, []string{"sh", "-c", "echo hi"}, []string(cfg.Cmd))
	require.Equal(t, spec.Env, cfg.Env)
	require.Equal(t, "65532:65532", cfg.User)
	require.Equal(t, "/home/agent", cfg.WorkingDir)
	require.False(t, cfg.Tty)
	require.False(t, cfg.OpenStdin)
	require.False(t, cfg.AttachStdin)
	require.Equal(t, "SIGTERM", cfg.StopSignal)
	require.Equal(t, map[string]string{jail.LabelRunID: "r1", jail.LabelManaged: "true"}, cfg.Labels)

	require.True(t, host.ReadonlyRootfs)
	require.Equal(t, []string{"ALL"}, []string(host.CapDrop))
	require.Empty(t, host.CapAdd)
	require.False(t, host.Privileged)
	require.Equal(t, []string{"no-new-privileges:true"}, host.SecurityOpt)
	require.NotNil(t, host.Init)
	require.True(t, *host.Init)
	require.False(t, host.AutoRemove)
	require.Equal(t, container.IPCModePrivate, host.IpcMode)
	require.Equal(t, container.NetworkMode("none"), host.NetworkMode)
	require.Empty(t, host.Runtime)
	require.Equal(t, int64(256<<20), host.Memory)
	require.Equal(t, host.Memory, host.MemorySwap, "no swap: the swap limit equals the memory limit")
	require.Equal(t, int64(1e9), host.NanoCPUs)
	require.NotNil(t, host.PidsLimit)
	require.Equal(t, int64(64), *host.PidsLimit)
	require.Equal(t, map[string]string{"/tmp": "size=16m,mode=1777"}, host.Tmpfs)
	require.Empty(t, host.Binds, "only typed mounts")
	require.Equal(t, container.LogConfig{Type: "none"}, host.LogConfig, "no OutputLogBytes: the engine keeps no output")
	require.Equal(t, []mount.Mount{{
		Type:        mount.TypeBind,
		Source:      "/srv/repo",
		Target:      "/work",
		ReadOnly:    true,
		BindOptions: &mount.BindOptions{CreateMountpoint: false},
	}}, host.Mounts)
}

func TestContainerConfigDoesNotAlias(t *testing.T) {
	t.Parallel()

	spec := validSpec()
	cfg, host, _, err := containerConfig(spec)
	require.NoError(t, err)
	cfg.Cmd[0] = "changed"
	cfg.Env[0] = "changed"
	host.Tmpfs["/other"] = ""
	require.Equal(t, "sh", spec.Cmd[0])
	require.Equal(t, "HOME=/home/agent", spec.Env[0])
	_, other := spec.Tmpfs.Get("/other")
	require.False(t, other)
	require.NotContains(t, spec.Labels, jail.LabelManaged, "the spec's labels are not modified")
}

func TestContainerConfigPassesThrough(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name  string
		edit  func(*jail.ContainerSpec)
		check func(*testing.T, *container.Config, *container.HostConfig)
	}{
		{
			name: "bridge network",
			edit: func(s *jail.ContainerSpec) { s.Network = "bridge" },
			check: func(t *testing.T, _ *container.Config, h *container.HostConfig) {
				require.Equal(t, container.NetworkMode("bridge"), h.NetworkMode)
			},
		},
		{
			name: "named network",
			edit: func(s *jail.ContainerSpec) { s.Network = "jetcrew-egress" },
			check: func(t *testing.T, _ *container.Config, h *container.HostConfig) {
				require.Equal(t, container.NetworkMode("jetcrew-egress"), h.NetworkMode)
			},
		},
		{
			name: "oci runtime",
			edit: func(s *jail.ContainerSpec) { s.OCIRuntime = "runsc" },
			check: func(t *testing.T, _ *container.Config, h *container.HostConfig) {
				require.Equal(t, "runsc", h.Runtime)
			},
		},
		{
			name: "managed label forced true",
			edit: func(s *jail.ContainerSpec) { s.Labels = map[string]string{jail.LabelManaged: "false"} },
			check: func(t *testing.T, c *container.Config, _ *container.HostConfig) {
				require.Equal(t, "true", c.Labels[jail.LabelManaged])
			},
		},
		{
			name: "read-write bind, no tmpfs, no cpu limit",
			edit: func(s *jail.ContainerSpec) {
				s.Mounts = []jail.Mount{{Source: "/a", Target: "/b"}}
				s.Tmpfs = nil
				s.NanoCPUs = 0
			},
			check: func(t *testing.T, _ *container.Config, h *container.HostConfig) {
				require.Len(t, h.Mounts, 1)
				require.False(t, h.Mounts[0].ReadOnly)
				require.Empty(t, h.Tmpfs)
				require.Zero(t, h.NanoCPUs)
			},
		},
		{
			name: "tmpfs flags",
			edit: func(s *jail.ContainerSpec) {
				s.Tmpfs = jail.TmpfsMounts{{Target: "/tmp", SizeBytes: 1 << 30, Mode: 0o1777, UID: 1, GID: 2}, {Target: "/run", SizeBytes: 1000, Mode: 0o755}}
			},
			check: func(t *testing.T, _ *container.Config, h *container.HostConfig) {
				require.Equal(t, map[string]string{"/tmp": "size=1024m,mode=1777,uid=1,gid=2", "/run": "size=1000,mode=0755"}, h.Tmpfs)
			},
		},
		{
			name: "output log",
			edit: func(s *jail.ContainerSpec) { s.OutputLogBytes = jail.DefaultOutputLogBytes },
			check: func(t *testing.T, _ *container.Config, h *container.HostConfig) {
				require.Equal(t, container.LogConfig{Type: "local", Config: map[string]string{
					"max-size": "16777216", "max-file": "4", "compress": "false",
				}}, h.LogConfig)
			},
		},
		{
			name: "output log of a size not divisible by 4",
			edit: func(s *jail.ContainerSpec) { s.OutputLogBytes = 10 },
			check: func(t *testing.T, _ *container.Config, h *container.HostConfig) {
				require.Equal(t, "3", h.LogConfig.Config["max-size"], "rounded up: at least the bound is kept")
			},
		},
		{
			name: "user with large ids",
			edit: func(s *jail.ContainerSpec) { s.User = "100000:100001" },
			check: func(t *testing.T, c *container.Config, _ *container.HostConfig) {
				require.Equal(t, "100000:100001", c.User)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spec := validSpec()
			tt.edit(&spec)
			cfg, host, _, err := containerConfig(spec)
			require.NoError(t, err)
			tt.check(t, cfg, host)
		})
	}
}

func TestContainerConfigRefuses(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		edit func(*jail.ContainerSpec)
		want string // substring of the error
	}{
		{"no user", func(s *jail.ContainerSpec) { s.User = "" }, "user is empty"},
		{"uid 0", func(s *jail.ContainerSpec) { s.User = "0" }, `user "0" is root`},
		{"root by name", func(s *jail.ContainerSpec) { s.User = "root" }, `user "root" is root`},
		{"root:root", func(s *jail.ContainerSpec) { s.User = "root:root" }, "is root"},
		{"0:gid", func(s *jail.ContainerSpec) { s.User = "0:65532" }, `user "0:65532" is root`},
		{"00:gid", func(s *jail.ContainerSpec) { s.User = "00:65532" }, "is root"},
		{"root group", func(s *jail.ContainerSpec) { s.User = "65532:0" }, "root group"},
		{"no gid", func(s *jail.ContainerSpec) { s.User = "65532" }, "has no group"},
		{"names", func(s *jail.ContainerSpec) { s.User = "agent:agent" }, "not numeric"},
		{"negative", func(s *jail.ContainerSpec) { s.User = "-1:-1" }, "not numeric"},
		{"no name", func(s *jail.ContainerSpec) { s.Name = "" }, "name"},
		{"bad name", func(s *jail.ContainerSpec) { s.Name = "a/b" }, "name"},
		{"no image", func(s *jail.ContainerSpec) { s.Image = "" }, "image is empty"},
		{"no cmd", func(s *jail.ContainerSpec) { s.Cmd = nil }, "cmd is empty"},
		{"env without =", func(s *jail.ContainerSpec) { s.Env = []string{"FOO"} }, `env entry "FOO"`},
		{"env empty key", func(s *jail.ContainerSpec) { s.Env = []string{"=x"} }, "env entry"},
		{"relative workdir", func(s *jail.ContainerSpec) { s.WorkingDir = "work" }, "working dir"},
		{"host network", func(s *jail.ContainerSpec) { s.Network = "host" }, "network"},
		{"container network", func(s *jail.ContainerSpec) { s.Network = "container:x" }, "network"},
		{"no memory limit", func(s *jail.ContainerSpec) { s.MemoryBytes = 0 }, "memory limit"},
		{"tiny memory limit", func(s *jail.ContainerSpec) { s.MemoryBytes = 1 << 20 }, "memory limit"},
		{"no pids limit", func(s *jail.ContainerSpec) { s.PidsLimit = 0 }, "pids limit"},
		{"negative cpus", func(s *jail.ContainerSpec) { s.NanoCPUs = -1 }, "cpu limit"},
		{"negative output log", func(s *jail.ContainerSpec) { s.OutputLogBytes = -1 }, "output log bound -1 bytes must not be negative"},
		{"relative tmpfs", func(s *jail.ContainerSpec) { s.Tmpfs = jail.TmpfsMounts{{Target: "tmp", SizeBytes: 1, Mode: 0o700}} }, "tmpfs target"},
		{"tmpfs on root", func(s *jail.ContainerSpec) { s.Tmpfs = jail.TmpfsMounts{{Target: "/", SizeBytes: 1, Mode: 0o700}} }, "root file system"},
		{"tmpfs without a size", func(s *jail.ContainerSpec) {
			s.Tmpfs = jail.TmpfsMounts{{Target: "/tmp", Mode: 0o1777}}
		}, `tmpfs /tmp: size 0 bytes must be positive`},
		{"tmpfs mode beyond 07777", func(s *jail.ContainerSpec) {
			s.Tmpfs = jail.TmpfsMounts{{Target: "/tmp", SizeBytes: 1 << 20, Mode: 0o17777}}
		}, `tmpfs /tmp: mode 17777 has bits beyond 07777`},
		{"tmpfs of a negative owner", func(s *jail.ContainerSpec) {
			s.Tmpfs = jail.TmpfsMounts{{Target: "/tmp", SizeBytes: 1 << 20, Mode: 0o700, UID: -1}}
		}, `tmpfs /tmp: owner -1:0 is negative`},
		{"relative source", func(s *jail.ContainerSpec) {
			s.Mounts = []jail.Mount{{Source: "repo", Target: "/work"}}
		}, "bind source"},
		{"relative target", func(s *jail.ContainerSpec) {
			s.Mounts = []jail.Mount{{Source: "/repo", Target: "work"}}
		}, "bind target"},
		{"bind on root", func(s *jail.ContainerSpec) {
			s.Mounts = []jail.Mount{{Source: "/repo", Target: "/"}}
		}, "root file system"},
		{"duplicate target", func(s *jail.ContainerSpec) {
			s.Mounts = []jail.Mount{{Source: "/a", Target: "/work"}, {Source: "/b", Target: "/work/"}}
		}, "mounted twice"},
		{"bind over tmpfs", func(s *jail.ContainerSpec) {
			s.Mounts = []jail.Mount{{Source: "/a", Target: "/tmp"}}
		}, "mounted twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spec := validSpec()
			tt.edit(&spec)
			_, _, _, err := containerConfig(spec)
			require.ErrorIs(t, err, jail.ErrPermanent)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

func TestContainerConfigListsEveryProblem(t *testing.T) {
	t.Parallel()

	spec := validSpec()
	spec.User = "0:0"
	spec.PidsLimit = 0
	_, _, _, err := containerConfig(spec)
	require.ErrorContains(t, err, "is root")
	require.ErrorContains(t, err, "pids limit")
}
