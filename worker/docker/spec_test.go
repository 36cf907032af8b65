package docker

import (
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/worker"
)

// validSpec returns a spec containerConfig accepts.
func validSpec() worker.ContainerSpec {
	return worker.ContainerSpec{
		Name:        "jetcrew-01J0000000000000000000000-1",
		Image:       "jetcrew-sandbox:latest",
		Cmd:         []string{"sh", "-c", "echo hi"},
		Env:         []string{"HOME=/home/agent", "EMPTY="},
		User:        "65532:65532",
		WorkingDir:  "/home/agent",
		Labels:      map[string]string{worker.LabelRunID: "r1"},
		MemoryBytes: 256 << 20,
		NanoCPUs:    1e9,
		PidsLimit:   64,
		Tmpfs:       map[string]string{"/tmp": "size=16m,mode=1777"},
		Mounts:      []worker.Mount{{Source: "/srv/repo", Target: "/work", ReadOnly: true}},
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
	require.Equal(t, map[string]string{worker.LabelRunID: "r1", worker.LabelManaged: "true"}, cfg.Labels)

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
	require.NotContains(t, spec.Tmpfs, "/other")
	require.NotContains(t, spec.Labels, worker.LabelManaged, "the spec's labels are not modified")
}

func TestContainerConfigPassesThrough(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name  string
		edit  func(*worker.ContainerSpec)
		check func(*testing.T, *container.Config, *container.HostConfig)
	}{
		{
			name: "bridge network",
			edit: func(s *worker.ContainerSpec) { s.Network = "bridge" },
			check: func(t *testing.T, _ *container.Config, h *container.HostConfig) {
				require.Equal(t, container.NetworkMode("bridge"), h.NetworkMode)
			},
		},
		{
			name: "named network",
			edit: func(s *worker.ContainerSpec) { s.Network = "jetcrew-egress" },
			check: func(t *testing.T, _ *container.Config, h *container.HostConfig) {
				require.Equal(t, container.NetworkMode("jetcrew-egress"), h.NetworkMode)
			},
		},
		{
			name: "oci runtime",
			edit: func(s *worker.ContainerSpec) { s.OCIRuntime = "runsc" },
			check: func(t *testing.T, _ *container.Config, h *container.HostConfig) {
				require.Equal(t, "runsc", h.Runtime)
			},
		},
		{
			name: "managed label forced true",
			edit: func(s *worker.ContainerSpec) { s.Labels = map[string]string{worker.LabelManaged: "false"} },
			check: func(t *testing.T, c *container.Config, _ *container.HostConfig) {
				require.Equal(t, "true", c.Labels[worker.LabelManaged])
			},
		},
		{
			name: "read-write bind, no tmpfs, no cpu limit",
			edit: func(s *worker.ContainerSpec) {
				s.Mounts = []worker.Mount{{Source: "/a", Target: "/b"}}
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
			edit: func(s *worker.ContainerSpec) {
				s.Tmpfs = map[string]string{"/tmp": "rw,exec,nosuid,nodev,size=1g,mode=1777,uid=1,gid=2,nr_inodes=1k", "/run": ""}
			},
			check: func(t *testing.T, _ *container.Config, h *container.HostConfig) {
				require.Len(t, h.Tmpfs, 2)
			},
		},
		{
			name: "user with large ids",
			edit: func(s *worker.ContainerSpec) { s.User = "100000:100001" },
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
		edit func(*worker.ContainerSpec)
		want string // substring of the error
	}{
		{"no user", func(s *worker.ContainerSpec) { s.User = "" }, "user is empty"},
		{"uid 0", func(s *worker.ContainerSpec) { s.User = "0" }, `user "0" is root`},
		{"root by name", func(s *worker.ContainerSpec) { s.User = "root" }, `user "root" is root`},
		{"root:root", func(s *worker.ContainerSpec) { s.User = "root:root" }, "is root"},
		{"0:gid", func(s *worker.ContainerSpec) { s.User = "0:65532" }, `user "0:65532" is root`},
		{"00:gid", func(s *worker.ContainerSpec) { s.User = "00:65532" }, "is root"},
		{"root group", func(s *worker.ContainerSpec) { s.User = "65532:0" }, "root group"},
		{"no gid", func(s *worker.ContainerSpec) { s.User = "65532" }, "has no group"},
		{"names", func(s *worker.ContainerSpec) { s.User = "agent:agent" }, "not numeric"},
		{"negative", func(s *worker.ContainerSpec) { s.User = "-1:-1" }, "not numeric"},
		{"no name", func(s *worker.ContainerSpec) { s.Name = "" }, "name"},
		{"bad name", func(s *worker.ContainerSpec) { s.Name = "a/b" }, "name"},
		{"no image", func(s *worker.ContainerSpec) { s.Image = "" }, "image is empty"},
		{"no cmd", func(s *worker.ContainerSpec) { s.Cmd = nil }, "cmd is empty"},
		{"env without =", func(s *worker.ContainerSpec) { s.Env = []string{"FOO"} }, `env entry "FOO"`},
		{"env empty key", func(s *worker.ContainerSpec) { s.Env = []string{"=x"} }, "env entry"},
		{"relative workdir", func(s *worker.ContainerSpec) { s.WorkingDir = "work" }, "working dir"},
		{"host network", func(s *worker.ContainerSpec) { s.Network = "host" }, "network"},
		{"container network", func(s *worker.ContainerSpec) { s.Network = "container:x" }, "network"},
		{"no memory limit", func(s *worker.ContainerSpec) { s.MemoryBytes = 0 }, "memory limit"},
		{"tiny memory limit", func(s *worker.ContainerSpec) { s.MemoryBytes = 1 << 20 }, "memory limit"},
		{"no pids limit", func(s *worker.ContainerSpec) { s.PidsLimit = 0 }, "pids limit"},
		{"negative cpus", func(s *worker.ContainerSpec) { s.NanoCPUs = -1 }, "cpu limit"},
		{"relative tmpfs", func(s *worker.ContainerSpec) { s.Tmpfs = map[string]string{"tmp": ""} }, "tmpfs target"},
		{"tmpfs on root", func(s *worker.ContainerSpec) { s.Tmpfs = map[string]string{"/": ""} }, "root file system"},
		{"unknown tmpfs option", func(s *worker.ContainerSpec) {
			s.Tmpfs = map[string]string{"/tmp": "size=16m,bogus=1"}
		}, `tmpfs /tmp: unknown option "bogus=1"`},
		{"tmpfs size without value", func(s *worker.ContainerSpec) {
			s.Tmpfs = map[string]string{"/tmp": "size"}
		}, `unknown option "size"`},
		{"relative source", func(s *worker.ContainerSpec) {
			s.Mounts = []worker.Mount{{Source: "repo", Target: "/work"}}
		}, "bind source"},
		{"relative target", func(s *worker.ContainerSpec) {
			s.Mounts = []worker.Mount{{Source: "/repo", Target: "work"}}
		}, "bind target"},
		{"bind on root", func(s *worker.ContainerSpec) {
			s.Mounts = []worker.Mount{{Source: "/repo", Target: "/"}}
		}, "root file system"},
		{"duplicate target", func(s *worker.ContainerSpec) {
			s.Mounts = []worker.Mount{{Source: "/a", Target: "/work"}, {Source: "/b", Target: "/work/"}}
		}, "mounted twice"},
		{"bind over tmpfs", func(s *worker.ContainerSpec) {
			s.Mounts = []worker.Mount{{Source: "/a", Target: "/tmp"}}
		}, "mounted twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spec := validSpec()
			tt.edit(&spec)
			_, _, _, err := containerConfig(spec)
			require.ErrorIs(t, err, worker.ErrPermanent)
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
