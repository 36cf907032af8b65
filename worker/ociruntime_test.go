package worker_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
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
		rt := listingRuntime{workertest.NewRuntime(), []string{"io.containerd.runc.v2", "runc"}}
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
		rt := listingRuntime{workertest.NewRuntime(), []string{"crun", "runc", "runsc"}}
		b := setup(t, func(c *worker.Config) { c.Runtime = rt; c.Profiles = profiles })
		b.submit(t, messages.RunRequest{ID: "g1", Profile: "gvisor", Prompt: "exit 0"})
		st := b.waitFinal(t, "g1")
		require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
		require.NotNil(t, st.Receipt)
		require.Equal(t, "runsc", st.Receipt.Runtime)
		require.Equal(t, "runsc", rt.Starts()[0].OCIRuntime)
	})
}
