package tests

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// TestGVisorAgents runs the coordination and backend fixtures under gVisor
// on one `jetcrew up`: two fixture agents of one group talk to each other
// through their bridges (each bridge in its own sandbox, relaying over its
// run's host unix socket), and every backend's fixture CLI runs its session
// (bridge, status, a send to the operator, its output format read back),
// all at once. It is the gVisor twin of TestCoordRoundTrip and TestBackends,
// with the assertions that hold under both runtimes.
func TestGVisorAgents(t *testing.T) {
	needsDocker(t)
	requireGVisor(t)
	requireAgentsImage(t)
	started := time.Now()
	t.Setenv(backendSecretEnv, backendSecret)

	var profiles strings.Builder
	fmt.Fprintf(&profiles, "%sruntime = %q\n\n", agentProfiles, gvisorRuntime)
	for _, c := range backendCases {
		fmt.Fprintf(&profiles, "[profiles.%s]\nbackend = %q\nimage = %q\nenv_from_host = [%q]\ntimeout = \"2m\"\nruntime = %q\n\n",
			c.backend, c.backend, agentsImage, backendSecretEnv, gvisorRuntime)
	}
	path := filepath.Join(t.TempDir(), "profiles.toml")
	require.NoError(t, os.WriteFile(path, []byte(profiles.String()), 0o644))
	url := up(t, "--profiles", path, "--concurrency", "16")

	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	tag := hex.EncodeToString(suffix)
	group := "gv-" + tag
	a, b := "gv-a-"+tag, "gv-b-"+tag
	script := `
		wait-peers 1 60s
		send @peer "hello from @self"
		expect-from @peer 60s`
	submitAgent(t, url, a, group, script)
	submitAgent(t, url, b, group, script)
	prompts := map[string]string{}
	for _, c := range backendCases {
		rid := "gv-be-" + c.backend + "-" + tag
		prompts[c.backend] = backendPrompt("Say hello to the operator through jetcrew, then report.",
			fmt.Sprintf(`fixture: step send operator "hello from the %s fixture"`, c.backend))
		submitStdin(t, url, c.backend, rid, prompts[c.backend])
	}

	for id, peer := range map[string]string{a: b, b: a} {
		rep, _ := finishedAgent(t, url, id, group)
		require.Equal(t, []string{"hello from " + peer}, rep.from(peer), "%s heard %s through the bridges", id, peer)
		require.Equal(t, peer, rep.Peer)
		require.Equal(t, id, rep.Status.RunID)
		require.Equal(t, 65532, rep.Probe.UID)
		require.Equal(t, 65532, rep.Probe.EUID)
		require.Equal(t, []string{messages.ContainerSocketPath}, rep.Probe.Sockets, "the run's own socket is the only socket in its filesystem")
		require.Empty(t, rep.Probe.DockerSockets)
		require.Equal(t, map[string]bool{messages.ContainerRunDir: true, messages.ContainerBridgePath: true}, rep.Probe.ReadOnly,
			"both coordination mounts are ro in gVisor's mountinfo")
		require.Equal(t, []string{"ask", "claim", "claims", "inbox", "release", "reply", "send", "status"}, rep.Tools)
		st := status(t, url, id)
		require.Equal(t, gvisorRuntime, st.Receipt.Runtime)
	}
	for _, c := range backendCases {
		rid := "gv-be-" + c.backend + "-" + tag
		st := waitFinal(t, url, rid)
		require.Equal(t, messages.StateSucceeded, st.State, "%s: %s", rid, st.Reason)
		require.Equal(t, fmt.Sprintf("fixture %s ok: peers=0, prompt %d bytes", c.backend, len(prompts[c.backend])), st.Result,
			"the worker read %s's output format", c.backend)
		require.True(t, st.BridgeConnected, rid)
		require.Equal(t, "available", st.Coordination, rid)
		require.Equal(t, gvisorRuntime, st.Receipt.Runtime, rid)
	}
	t.Logf("%d runs under gVisor in %s", 2+len(backendCases), time.Since(started).Round(time.Millisecond))
}

// TestGVisorEgress: an egress profile under gVisor (plain "runsc", network
// none). The run's only way out is the egress proxy's unix socket, which
// the relay inside reaches through runsc's --host-uds=open: its own
// provider name answers through the proxy, and every other way out fails,
// with the same checks as TestEgressAllowlist.
func TestGVisorEgress(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	requireGVisor(t)
	e := startEgressWorkerWith(t, fmt.Sprintf("runtime = %q", gvisorRuntime))
	id := "gv-eg-api-" + opsSuffix(t)
	e.submit(t, id, "api", egressScript(e.provider, e.gateway, e.natsPort))
	requireEgressRun(t, e, "api", id)
	st := waitState(t, e.url, id, func(s messages.RunState) bool { return s.State.Final() })
	require.Equal(t, gvisorRuntime, st.Receipt.Runtime)
}
