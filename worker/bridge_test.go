package worker_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage/coord"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// commandProfiles are command profiles with coordination on: one that must
// reach its bridge (the default), one that opts out, one that is handed the
// MCP config's path as an argument.
func commandProfiles(t *testing.T) profile.Profiles {
	t.Helper()
	ps, err := profile.ParseProfiles("cmd.toml", []byte(`
[profiles.must]
image = "i"
command = ["/bin/sh", "-c", "{prompt}"]
bridge_deadline = "300ms"
[profiles.may]
image = "i"
command = ["/bin/sh", "-c", "{prompt}"]
bridge_deadline = "300ms"
require_bridge = false
[profiles.mcp]
image = "i"
command = ["agent", "--mcp-config", "{mcp_config}", "{prompt}"]
`))
	require.NoError(t, err)
	return ps
}

// A command profile's process that never reaches its bridge is stopped at
// the bridge deadline, like an agent CLI's; with require_bridge = false it
// runs on, and its state and finished event say coordination was unused.
func TestCommandBackendBridgeDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *worker.Config) { c.Profiles = commandProfiles(t) })

	b.submit(t, messages.RunRequest{ID: "must1", Profile: "must", Prompt: "sleep 1m"})
	st := b.waitFinal(t, "must1")
	require.Equal(t, messages.StateFailed, st.State)
	require.Contains(t, st.Reason, "did not start the jetcrew MCP server within 300ms")
	require.Equal(t, "300ms", st.Receipt.BridgeDeadline)

	b.submit(t, messages.RunRequest{ID: "may1", Profile: "may", Prompt: "sleep 600ms; out done"})
	st = b.waitFinal(t, "may1")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.False(t, st.BridgeConnected)
	require.Equal(t, "unused", st.Coordination)
	require.Empty(t, st.Receipt.BridgeDeadline)
	var fin messages.Event
	// The finished event follows the recorded state.
	require.Eventually(t, func() bool {
		for _, m := range b.events(t, "may1") {
			if m.Subject() == messages.SubjectEvents("may1", messages.EventFinished) {
				require.NoError(t, json.Unmarshal(m.Data(), &fin))
				return true
			}
		}
		return false
	}, 5*time.Second, 20*time.Millisecond)
	require.Equal(t, messages.StateSucceeded, fin.State)
	require.Equal(t, "unused", fin.Coordination, "the finished event says coordination was not used")
}

// A process that exits on its own before its bridge connected fails its
// run, whatever its exit code, long before the bridge deadline: an MCP
// client started without its config exits 0 having done its work blind. A
// non-zero exit is still retried while the profile's retries last. A
// process that reached its bridge and exits 0 succeeds; with
// require_bridge = false a blind exit succeeds, coordination "unused".
func TestCommandBackendExitBeforeBridge(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *worker.Config) {
		ps, err := profile.ParseProfiles("blind.toml", []byte(`
[profiles.blind]
image = "i"
command = ["/bin/sh", "-c", "{prompt}"]
retries = 1
[profiles.may]
image = "i"
command = ["/bin/sh", "-c", "{prompt}"]
require_bridge = false
`))
		require.NoError(t, err)
		c.Profiles = ps
		// The prompt "hello" reaches the bridge's socket, as the bridge
		// does when an MCP client starts it, then exits 0.
		c.Runtime.(*workertest.Runtime).Behave = func(spec jail.ContainerSpec) (workertest.Behaviour, error) {
			if spec.Cmd[len(spec.Cmd)-1] != "hello" {
				return workertest.ScriptBehaviour(spec)
			}
			return func(ctx context.Context, spec jail.ContainerSpec, _ jail.OutputFunc) jail.ExitStatus {
				cl := relay.NewClient(filepath.Join(runDirOf(spec), messages.SocketName))
				defer cl.Close()
				if err := cl.Hello(ctx); err != nil {
					return jail.ExitStatus{Code: 1}
				}
				return jail.ExitStatus{}
			}, nil
		}
	})
	cases := []struct {
		id, profile, prompt string
		state               messages.State
		reason              string
		exit, attempts      int
		coordination        string
		connected           bool
	}{
		{"blind0", "blind", "out done", messages.StateFailed, coord.ExitedBeforeBridge("exit code 0"), 0, 1, "available", false},
		{"blind3", "blind", "err boom; exit 3", messages.StateFailed, coord.ExitedBeforeBridge("exit code 3: boom"), 3, 2, "available", false},
		{"oom", "blind", "oom", messages.StateFailed, coord.ExitedBeforeBridge("oom"), 137, 1, "available", false},
		{"reached", "blind", "hello", messages.StateSucceeded, "", 0, 1, "available", true},
		{"optout", "may", "out done", messages.StateSucceeded, "", 0, 1, "unused", false},
	}
	for _, tc := range cases {
		b.submit(t, messages.RunRequest{ID: tc.id, Profile: tc.profile, Prompt: tc.prompt})
	}
	for _, tc := range cases {
		st := b.waitFinal(t, tc.id)
		require.Equal(t, tc.state, st.State, "%s: %s", tc.id, st.Reason)
		require.Equal(t, tc.reason, st.Reason, tc.id)
		require.Equal(t, tc.exit, *st.ExitCode, tc.id)
		require.Equal(t, tc.attempts, st.Attempts, tc.id)
		require.Equal(t, tc.coordination, st.Coordination, tc.id)
		require.Equal(t, tc.connected, st.BridgeConnected, tc.id)
		var fin messages.Event
		require.Eventually(t, func() bool {
			for _, m := range b.events(t, tc.id) {
				if m.Subject() == messages.SubjectEvents(tc.id, messages.EventFinished) {
					require.NoError(t, json.Unmarshal(m.Data(), &fin))
					return true
				}
			}
			return false
		}, 5*time.Second, 20*time.Millisecond)
		require.Equal(t, tc.state, fin.State, "the finished event of %s follows the recorded state", tc.id)
		require.Equal(t, tc.reason, fin.Reason, tc.id)
	}
}

// {mcp_config} in a command profile's argv is the MCP config's path in the
// container.
func TestCommandBackendMCPConfigPlaceholder(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *worker.Config) { c.Profiles = commandProfiles(t) })
	b.submit(t, messages.RunRequest{ID: "mcp1", Profile: "mcp", Prompt: "hi"})
	b.waitFinal(t, "mcp1")
	starts := b.rt.Starts()
	require.Len(t, starts, 1)
	require.Equal(t, []string{"agent", "--mcp-config", "/run/jetcrew/mcp.json", "hi"}, starts[0].Cmd)
}

// A run mounts the worker's content-addressed copy of the bridge, and its
// receipt names the copy's digest.
func TestRunMountsStagedBridge(t *testing.T) {
	t.Parallel()
	var bridge, stateDir string
	b := setup(t, func(c *worker.Config) { bridge, stateDir = c.BridgePath, c.StateDir })
	b.submit(t, messages.RunRequest{ID: "sb1", Profile: "shell", Prompt: "out hi"})
	st := b.waitFinal(t, "sb1")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	data, err := os.ReadFile(bridge)
	require.NoError(t, err)
	sum := sha256.Sum256(data)
	digest := hex.EncodeToString(sum[:])
	require.Equal(t, "sha256:"+digest, st.Receipt.BridgeDigest)
	staged := filepath.Join(stateDir, "bin", digest)
	require.Contains(t, b.rt.Starts()[0].Mounts, jail.Mount{Source: staged, Target: "/opt/jetcrew/bridge", ReadOnly: true})
	fi, err := os.Stat(staged)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o555), fi.Mode().Perm())
}
