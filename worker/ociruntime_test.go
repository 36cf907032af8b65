package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// listingRuntime is the fake runtime with an engine that offers names.
type listingRuntime struct {
	*workertest.Runtime
	names []string
}

func (r listingRuntime) OCIRuntimes(context.Context) ([]string, error) { return r.names, nil }

// TestProfileRuntimeNames: a profile may name any OCI runtime (the engine
// decides which exist); a name that could not be one is refused.
func TestProfileRuntimeNames(t *testing.T) {
	t.Parallel()
	for _, rt := range []string{"runc", "runsc", "runsc-net", "crun", "kata-runtime", "sysbox-runc", "io.containerd.runc.v2"} {
		_, err := profile.ParseProfiles("p", []byte("[profiles.x]\nimage = \"i\"\ncommand = [\"true\"]\nruntime = \""+rt+"\"\n"))
		require.NoError(t, err, rt)
	}
	for _, rt := range []string{"run sc", "../runsc", "runsc;rm", "a/b"} {
		_, err := profile.ParseProfiles("p", []byte("[profiles.x]\nimage = \"i\"\ncommand = [\"true\"]\nruntime = \""+rt+"\"\n"))
		require.ErrorContains(t, err, "is not a runtime name", rt)
	}
}

// TestStartRefusesMissingOCIRuntime: the worker checks every profile's
// runtime against the engine's list at start, refuses to start naming the
// profile, its runtime and what the engine offers, and starts when the
// engine has them all; the receipt records the runtime.
func TestStartRefusesMissingOCIRuntime(t *testing.T) {
	t.Parallel()
	profiles, err := profile.ParseProfiles("p", []byte(`
[profiles.gvisor]
image = "img"
command = ["/bin/sh", "-c", "{prompt}"]
runtime = "runsc"
require_bridge = false
`))
	require.NoError(t, err)

	t.Run("missing", func(t *testing.T) {
		t.Parallel()
		s := workertest.StartServer(t)
		rt := listingRuntime{workertest.NewTestRuntime(t), []string{"io.containerd.runc.v2", "runc"}}
		w, err := worker.New(workertest.Connect(t, s), worker.Config{StateDir: workertest.StateDir(t), BridgePath: workertest.BridgeFile(t),
			ID: "w1", Runtime: rt, Profiles: profiles})
		require.NoError(t, err)
		err = w.Start(context.Background())
		require.ErrorIs(t, err, profile.ErrOCIRuntimeMissing)
		require.EqualError(t, err, `worker: OCI runtime not offered by the engine: profile "gvisor" names runtime "runsc"; `+
			`the engine offers: io.containerd.runc.v2, runc (register the runtime in the daemon's "runtimes", docs/jail.md)`)
	})

	t.Run("present", func(t *testing.T) {
		t.Parallel()
		rt := listingRuntime{workertest.NewTestRuntime(t), []string{"crun", "runc", "runsc"}}
		b := setup(t, func(c *worker.Config) { c.Runtime = rt; c.Profiles = profiles })
		b.submit(t, messages.RunRequest{ID: "g1", Profile: "gvisor", Prompt: "exit 0"})
		st := b.waitFinal(t, "g1")
		require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
		require.NotNil(t, st.Receipt)
		require.Equal(t, "runsc", st.Receipt.Runtime)
		starts := rt.Starts()
		require.Len(t, starts, 2, "the runtime's proof at start, then the run")
		require.Equal(t, jail.RoleRuntimeProof, starts[0].Labels[jail.LabelRole])
		require.Equal(t, jail.RoleRun, starts[1].Labels[jail.LabelRole])
		require.Equal(t, "runsc", starts[1].OCIRuntime)
	})
}

// engineHybridCgroups is what Docker Engine 20.10 answers (HTTP 500) to a
// container start under crun 1.8.1 on a host whose cgroups are hybrid.
const engineHybridCgroups = "docker start: Error response from daemon: failed to create shim task: OCI runtime create failed: " +
	"cgroups in hybrid mode not supported, drop all controllers from cgroupv2: unknown"

// TestStartProvesOCIRuntimes: the worker proves at start that each OCI
// runtime a profile names can start a container, with one container of
// that profile's jail and image (the sandbox image when the engine lacks
// it), removed at once. A runtime the engine lists but that cannot start
// one fails the start with the engine's own error, after three tries for
// an error the runtime does not call permanent, at once for one it does;
// no run is ever taken and no container is left.
func TestStartProvesOCIRuntimes(t *testing.T) {
	t.Parallel()
	profiles, err := profile.ParseProfiles("p", []byte(`
[profiles.fast]
image = "img-fast"
command = ["/bin/sh", "-c", "{prompt}"]
runtime = "crun"
pids = 77
user = "4242:4343"
require_bridge = false
[profiles.gvisor]
image = "img"
command = ["/bin/sh", "-c", "{prompt}"]
runtime = "runsc"
require_bridge = false
[profiles.plain]
image = "img"
command = ["/bin/sh", "-c", "{prompt}"]
require_bridge = false
`))
	require.NoError(t, err)
	engine := []string{"crun", "runc", "runsc"}
	start := func(t *testing.T, startErr func(jail.ContainerSpec) error) (*workertest.Runtime, error) {
		t.Helper()
		s := workertest.StartServer(t)
		rt := workertest.NewRuntime()
		rt.StartErr = startErr
		w, err := worker.New(workertest.Connect(t, s), worker.Config{StateDir: workertest.StateDir(t), BridgePath: workertest.BridgeFile(t),
			ID: "w1", Runtime: listingRuntime{rt, engine}, Profiles: profiles})
		require.NoError(t, err)
		err = w.Start(context.Background())
		if err == nil {
			t.Cleanup(func() { require.NoError(t, w.Stop(context.Background())) })
		}
		return rt, err
	}

	t.Run("proved", func(t *testing.T) {
		t.Parallel()
		rt, err := start(t, nil)
		require.NoError(t, err)
		starts := rt.Starts()
		require.Len(t, starts, 2, "one container per runtime named, none for the engine's default")
		crun, runsc := starts[0], starts[1]
		require.Equal(t, "crun", crun.OCIRuntime)
		require.Equal(t, "runsc", runsc.OCIRuntime)
		require.Equal(t, "img-fast", crun.Image, "the profile's own image")
		require.Equal(t, "4242:4343", crun.User, "the profile's own jail")
		require.EqualValues(t, 77, crun.PidsLimit)
		require.Equal(t, "none", crun.Network)
		require.Equal(t, jail.RoleRuntimeProof, crun.Labels[jail.LabelRole])
		require.Equal(t, "fast", crun.Labels[jail.LabelProfile])
		require.Equal(t, "w1", crun.Labels[jail.LabelWorker])
		require.NotEmpty(t, crun.Labels[jail.LabelInstall], "the reconciler knows whose it is")
		require.Zero(t, rt.Live(), "proof containers are removed")
	})

	t.Run("unusable runtime fails the start", func(t *testing.T) {
		t.Parallel()
		var tries atomic.Int32
		rt, err := start(t, func(spec jail.ContainerSpec) error {
			if spec.OCIRuntime == "crun" {
				tries.Add(1)
				return errors.New(engineHybridCgroups)
			}
			return nil
		})
		require.ErrorIs(t, err, profile.ErrOCIRuntimeUnusable)
		require.EqualError(t, err, `worker: OCI runtime cannot start containers: runtime "crun" (profile "fast") could not start a container `+
			`of image "img-fast" on this engine: `+engineHybridCgroups+` (use the runtime on a host where it works, or change the profile; docs/jail.md)`)
		require.EqualValues(t, 3, tries.Load(), "an error the runtime does not call permanent is tried three times")
		require.Zero(t, rt.Live())
	})

	t.Run("permanent error at once", func(t *testing.T) {
		t.Parallel()
		var tries atomic.Int32
		_, err := start(t, func(spec jail.ContainerSpec) error {
			if spec.OCIRuntime == "runsc" {
				tries.Add(1)
				return fmt.Errorf("docker create: Error response from daemon: Unknown runtime specified runsc: %w", jail.ErrPermanent)
			}
			return nil
		})
		require.ErrorIs(t, err, profile.ErrOCIRuntimeUnusable)
		require.ErrorContains(t, err, `runtime "runsc" (profile "gvisor")`)
		require.ErrorContains(t, err, "Unknown runtime specified runsc")
		require.EqualValues(t, 1, tries.Load())
	})

	t.Run("sandbox image when the profile's is missing", func(t *testing.T) {
		t.Parallel()
		rt, err := start(t, func(spec jail.ContainerSpec) error {
			if spec.Image == "img-fast" {
				return fmt.Errorf("docker: image %q not found: %w", spec.Image, jail.ErrImageNotFound)
			}
			return nil
		})
		require.NoError(t, err)
		crun := rt.Starts()[0]
		require.Equal(t, "crun", crun.OCIRuntime)
		require.Equal(t, profile.SandboxImage, crun.Image)
		require.Equal(t, "4242:4343", crun.User, "still the profile's jail")
		require.Zero(t, rt.Live())
	})

	t.Run("no image to prove it with", func(t *testing.T) {
		t.Parallel()
		rt, err := start(t, func(spec jail.ContainerSpec) error {
			if spec.OCIRuntime == "crun" {
				return fmt.Errorf("docker: image %q not found: %w", spec.Image, jail.ErrImageNotFound)
			}
			return nil
		})
		require.ErrorIs(t, err, profile.ErrOCIRuntimeUnusable)
		require.EqualError(t, err, `worker: OCI runtime cannot start containers: runtime "crun" (profile "fast") could not be proved: `+
			`none of the images ["img-fast" "jetcrew-sandbox:latest"] is on this engine (build one: make images)`)
		require.Empty(t, rt.Starts())
	})
}
