package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
)

// The agent backends end to end: every backend's run goes through a real
// `jetcrew up` into a jailed container of the agents image, where the
// fixture agent (tests/fixtures/agent), installed under the CLI's name,
// stands in for the real CLI. It refuses (exit 1, reason on stderr) any
// flag, variable or MCP configuration its real counterpart would need and
// did not get, reads the prompt from standard input, starts the bridge its
// configuration names, calls status and a send, and prints its session in
// the CLI's own output format, which the worker must read back: the run's
// result is the fixture's last answer.

// backendSecretEnv is passed to every backend profile with env_from_host;
// its value must reach the CLI and appear nowhere jetcrew records anything.
const (
	backendSecretEnv = "JETCREW_TEST_SECRET"
	backendSecret    = "s3cr3t-value"
)

// backendCase is what the worker's plan for one backend is, as a receipt
// shows it, and what the worker must read from the CLI's output.
type backendCase struct {
	backend string
	// argv is the CLI's command line after the launcher's "--".
	argv []string
	// homeSeed says the launcher seeds HOME from /run/jetcrew/home.
	homeSeed bool
	// files are the backend's files besides mcp.json and the prompt.
	files []messages.ReceiptFile
	// env are the backend's own variables.
	env []string
	// kinds are agent event kinds the worker must have read.
	kinds []string
	// unsupported says the receipt lists what the CLI cannot honour.
	unsupported bool
	// steer is the launcher's --steer format: the CLI takes streamed
	// input.
	steer string
}

var backendCases = []backendCase{
	{
		backend: "claude",
		argv: []string{"claude", "-p", "--output-format", "stream-json", "--verbose", "--input-format", "stream-json",
			"--mcp-config", messages.ContainerMCPConfigPath, "--strict-mcp-config", "--dangerously-skip-permissions"},
		steer: messages.SteerInputClaude,
		kinds: []string{"system/init", "assistant", "user", "result"},
	},
	{
		backend:  "codex",
		argv:     []string{"codex", "exec", "--json", "--skip-git-repo-check", "-"},
		homeSeed: true,
		files:    []messages.ReceiptFile{{Path: "/run/jetcrew/home/.codex/config.toml", Mode: "0444"}},
		env:      []string{"CODEX_HOME"},
		kinds:    []string{"thread.started", "turn.started", "item.started", "item.completed", "turn.completed"},
	},
	{
		backend: "gemini",
		argv:    []string{"gemini", "--output-format", "stream-json", "--approval-mode", "yolo"},
		files:   []messages.ReceiptFile{{Path: "/run/jetcrew/gemini-settings.json", Mode: "0444"}},
		env:     []string{"GEMINI_CLI_SYSTEM_SETTINGS_PATH"},
		kinds:   []string{"init", "message", "tool_use", "tool_result", "result"},
	},
	{
		backend: "opencode",
		argv:    []string{"opencode", "run", "--format", "json"},
		env:     []string{"OPENCODE_CONFIG_CONTENT"},
		kinds:   []string{"step_start", "tool_use", "text", "step_finish"},
	},
	{
		backend: "kimi",
		argv: []string{"kimi", "--print", "--output-format", "stream-json", "--input-format", "stream-json",
			"--mcp-config-file", messages.ContainerMCPConfigPath},
		steer: messages.SteerInputKimi,
		kinds: []string{"assistant", "tool"},
	},
	{
		backend:     "pi",
		argv:        []string{"pi", "--print", "--mode", "json"},
		homeSeed:    true,
		files:       []messages.ReceiptFile{{Path: "/run/jetcrew/home/.pi/agent/mcp.json", Mode: "0444"}},
		kinds:       []string{"agent_start", "turn_start", "tool_execution_start", "tool_execution_end", "message_end", "agent_end"},
		unsupported: true,
	},
}

// backendProfiles is the profile file: one profile per backend, and the
// profiles of the failure cases.
func backendProfiles() string {
	var b strings.Builder
	profile := func(name, backend, image string, extra ...string) {
		fmt.Fprintf(&b, "[profiles.%s]\nbackend = %q\nimage = %q\nenv_from_host = [%q]\ntimeout = \"2m\"\n", name, backend, image, backendSecretEnv)
		for _, e := range extra {
			b.WriteString(e + "\n")
		}
		b.WriteString("\n")
	}
	for _, c := range backendCases {
		profile(c.backend, c.backend, agentsImage, `stall_timeout = "30s"`, `bridge_deadline = "30s"`)
	}
	profile("claude-mcp-failed", "claude", agentsImage, `stall_timeout = "40s"`, `bridge_deadline = "40s"`)
	profile("codex-no-bridge", "codex", agentsImage, `stall_timeout = "40s"`, `bridge_deadline = "3s"`)
	profile("codex-stall", "codex", agentsImage, `stall_timeout = "3s"`, `bridge_deadline = "40s"`)
	profile("claude-no-image", "claude", "jetcrew-nope:latest")
	return b.String()
}

// backendPrompt is a prompt for the fixture: a task (which it ignores), the
// secret it must have received (by its SHA-256) and directives.
func backendPrompt(task string, directives ...string) string {
	sum := sha256.Sum256([]byte(backendSecret))
	lines := append([]string{task, "fixture: secret " + backendSecretEnv + " " + hex.EncodeToString(sum[:])}, directives...)
	return strings.Join(lines, "\n") + "\n"
}

// longPrompt returns a prompt of exactly n bytes that tells the fixture its
// size.
func longPrompt(n int) string {
	p := backendPrompt("Read all of the following and report its size.", fmt.Sprintf("fixture: bytes %d", n))
	var b strings.Builder
	b.WriteString(p)
	line := strings.Repeat("all work and no play makes a long prompt; ", 2) + "\n"
	for b.Len()+len(line) <= n-len("the end\n") {
		b.WriteString(line)
	}
	b.WriteString(strings.Repeat("z", n-len("the end\n")-b.Len()))
	b.WriteString("the end\n")
	return b.String()
}

// submitStdin submits a run of profile with prompt on submit's standard
// input (a long prompt is no argument).
func submitStdin(t *testing.T, url, profile, id, prompt string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, jetcrewBin, "submit", "--profile", profile, "--id", id, "-")
	cmd.Env = append(os.Environ(), "NATS_URL="+url)
	cmd.Stdin = strings.NewReader(prompt)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "submit %s: %s", id, out)
}

// storedMsg is one message of a JetStream stream.
type storedMsg struct {
	stream, subject string
	header          nats.Header
	data            []byte
}

// allStreamMessages returns every message of every stream on the server:
// run states (the key-value bucket's stream), events, dead letters and
// coordination messages.
func allStreamMessages(t *testing.T, url string) []storedMsg {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var msgs []storedMsg
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		s, err := js.Stream(ctx, name)
		require.NoError(t, err)
		info, err := s.Info(ctx)
		require.NoError(t, err)
		for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			require.NoError(t, err)
			msgs = append(msgs, storedMsg{stream: name, subject: m.Subject, header: m.Header, data: m.Data})
		}
	}
	require.NoError(t, names.Err())
	return msgs
}

// runEvents returns run id's agent events and coordination events among
// msgs.
func runEvents(msgs []storedMsg, id string) ([]messages.AgentEvent, []coordination.Event) {
	var agent []messages.AgentEvent
	var coord []coordination.Event
	for _, m := range msgs {
		switch m.subject {
		case messages.SubjectEvents(id, messages.EventAgent):
			var ev messages.AgentEvent
			if json.Unmarshal(m.data, &ev) == nil {
				agent = append(agent, ev)
			}
		case messages.SubjectEvents(id, messages.EventCoord):
			var ev coordination.Event
			if json.Unmarshal(m.data, &ev) == nil {
				coord = append(coord, ev)
			}
		}
	}
	return agent, coord
}

// requireBackendReceipt checks the receipt of a run of c's backend under
// profile: what ran, as whom, with which mounts, files and variable names.
func requireBackendReceipt(t *testing.T, rc *messages.Receipt, c backendCase, profileName, bridgeDigest string) {
	t.Helper()
	require.NotNil(t, rc, "every outcome carries a receipt")
	require.Equal(t, profileName, rc.Profile)
	require.Len(t, rc.ProfileDigest, 64)
	require.Equal(t, c.backend, rc.Backend)
	require.Equal(t, "65532:65532", rc.User)
	require.Equal(t, "none", rc.Network)

	// The launcher binds the profile's secret at start (--env-file).
	argv := []string{messages.ContainerBridgePath, "launch", "--env-file", profile.LaunchEnvPath, "--stdin", "/run/jetcrew/prompt"}
	if c.steer != "" {
		argv = append(argv, "--steer", c.steer)
	}
	if c.homeSeed {
		argv = append(argv, "--home-seed", "/run/jetcrew/home")
	}
	require.Equal(t, append(append(argv, "--"), c.argv...), rc.Argv)

	require.Len(t, rc.Mounts, 2, "%+v", rc.Mounts)
	mounts := map[string]messages.ReceiptMount{}
	for _, m := range rc.Mounts {
		mounts[m.Target] = m
	}
	runDir := mounts[messages.ContainerRunDir]
	require.True(t, runDir.ReadOnly, "%s is read-only", messages.ContainerRunDir)
	require.Equal(t, "run-dir", runDir.Role)
	require.Regexp(t, `^sha256:[0-9a-f]{64}$`, runDir.Digest)
	require.Equal(t, messages.ReceiptMount{Target: messages.ContainerBridgePath, Role: "bridge",
		Digest: "sha256:" + bridgeDigest, ReadOnly: true}, mounts[messages.ContainerBridgePath], "the mounted bridge is the content-addressed copy of the worker's binary")
	require.Equal(t, "sha256:"+bridgeDigest, rc.BridgeDigest)
	// No host path: receipts name mounts by role and digest only.
	b, err := json.Marshal(rc)
	require.NoError(t, err)
	require.NotContains(t, string(b), `"source"`)
	require.NotContains(t, string(b), os.TempDir()+"/jetcrew-", "no state dir path")
	require.Equal(t, []string{messages.MCPServerName}, rc.MCPServers)
	files := append([]messages.ReceiptFile{
		{Path: messages.ContainerMCPConfigPath, Mode: "0444"},
		{Path: "/run/jetcrew/prompt", Mode: "0444"},
		{Path: profile.LaunchEnvPath, Mode: "0444"},
	}, c.files...)
	require.ElementsMatch(t, files, rc.Files)
	env := append([]string{"HOME", "JETCREW_GROUP", "JETCREW_MCP_CONFIG", "JETCREW_PROFILE", "JETCREW_RUN_ID", backendSecretEnv}, c.env...)
	require.ElementsMatch(t, env, rc.EnvNames, "the receipt names every variable set, the secret's included, and no value")
	if c.unsupported {
		require.NotEmpty(t, rc.Unsupported)
	}
}

// One `jetcrew up`, one run per backend, the failure cases and a long
// prompt, all at once.
func TestBackends(t *testing.T) {
	needsDocker(t)
	requireAgentsImage(t)
	started := time.Now()
	t.Setenv(backendSecretEnv, backendSecret)
	dir := t.TempDir()
	profiles := filepath.Join(dir, "profiles.toml")
	require.NoError(t, os.WriteFile(profiles, []byte(backendProfiles()), 0o644))
	url, workerLog := upLogged(t, "--profiles", profiles, "--concurrency", "16")
	// The worker stages its own binary as the bridge: its digest names it.
	bridge := fileSHA256(t, jetcrewBin)

	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	id := func(name string) string { return "be-" + name + "-" + hex.EncodeToString(suffix) }

	type submitted struct {
		profile, prompt string
	}
	runs := map[string]submitted{}
	submit := func(name, profile, prompt string) {
		runs[id(name)] = submitted{profile, prompt}
		submitStdin(t, url, profile, id(name), prompt)
	}
	for _, c := range backendCases {
		submit(c.backend, c.backend, backendPrompt(
			"Say hello to the operator through jetcrew, then report.",
			fmt.Sprintf(`fixture: step send operator "hello from the %s fixture"`, c.backend)))
	}
	const longSize = 200 << 10
	submit("long", "claude", longPrompt(longSize))
	submit("mcp-failed", "claude-mcp-failed", backendPrompt("Work without coordination.", "fixture: mcp-status failed", "fixture: hang"))
	submit("no-bridge", "codex-no-bridge", backendPrompt("Never start the bridge.", "fixture: no-bridge", "fixture: hang"))
	submit("stall", "codex-stall", backendPrompt("Start the bridge, then go quiet.", "fixture: hang"))
	submit("no-image", "claude-no-image", backendPrompt("Never runs."))
	require.Len(t, runs, len(backendCases)+5)

	states := map[string]messages.RunState{}
	stateJSON := map[string]string{}
	for rid := range runs {
		states[rid] = waitFinal(t, url, rid)
		r := run(t, url, jetcrewBin, "status", "--json", rid)
		require.Equal(t, 0, r.code, r.stderr)
		stateJSON[rid] = r.stdout
	}
	t.Logf("%d runs final %s after the test began", len(runs), time.Since(started).Round(time.Millisecond))
	for _, rid := range slices.Sorted(maps.Keys(states)) {
		st := states[rid]
		ran := "never started"
		if !st.StartedAt.IsZero() {
			ran = "ran " + st.FinishedAt.Sub(st.StartedAt).Round(time.Millisecond).String()
		}
		t.Logf("%-26s %-18s %-9s %s; %s", rid, runs[rid].profile, st.State, ran, st.Reason)
	}

	// The agent and coordination events are core publishes the events
	// stream captures: wait (a while, at most) until every successful
	// backend run's send is there. What is missing fails below, run by run.
	var msgs []storedMsg
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		msgs = allStreamMessages(t, url)
		complete := true
		for _, c := range backendCases {
			if states[id(c.backend)].State != messages.StateSucceeded {
				continue
			}
			_, coord := runEvents(msgs, id(c.backend))
			complete = complete && slices.ContainsFunc(coord, func(ev coordination.Event) bool { return ev.Kind == coordination.EventSent })
		}
		if complete || time.Now().After(deadline) {
			break
		}
	}

	for _, c := range backendCases {
		t.Run(c.backend, func(t *testing.T) {
			rid := id(c.backend)
			st := states[rid]
			want := fmt.Sprintf("fixture %s ok: peers=0, prompt %d bytes", c.backend, len(runs[rid].prompt))
			require.Equal(t, messages.StateSucceeded, st.State, "%s: %s", rid, st.Reason)
			require.Equal(t, 0, *st.ExitCode)
			require.Equal(t, want, st.Result, "the worker read the CLI's output format")
			require.True(t, st.BridgeConnected, "state: %s", stateJSON[rid])
			require.Equal(t, "available", st.Coordination)
			requireBackendReceipt(t, st.Receipt, c, c.backend, bridge)
			require.Equal(t, agentsImage, st.Receipt.Image)
			require.True(t, strings.HasPrefix(st.Receipt.ImageID, "sha256:"), "image id %q", st.Receipt.ImageID)
			require.Equal(t, "30s", st.Receipt.StallTimeout)
			require.Equal(t, "30s", st.Receipt.BridgeDeadline)

			agent, coord := runEvents(msgs, rid)
			var kinds []string
			final := false
			for _, ev := range agent {
				require.Equal(t, rid, ev.RunID)
				kinds = append(kinds, ev.Kind)
				final = final || ev.Text == want
			}
			for _, k := range c.kinds {
				require.Contains(t, kinds, k, "agent events read from %s's output", c.backend)
			}
			require.True(t, final, "an agent event carries the result: %+v", agent)
			require.NotEmpty(t, coord)
			require.Equal(t, coordination.EventConnected, coord[0].Kind)
			require.Equal(t, coordination.RecipientOperator, coord[len(coord)-1].To)
			if c.backend == "claude" {
				require.Equal(t, map[string]string{messages.MCPServerName: "connected"}, st.Agent.MCPServers)
				require.False(t, st.Agent.IsError)
			}
		})
	}

	t.Run("long prompt", func(t *testing.T) {
		st := states[id("long")]
		require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
		require.Equal(t, fmt.Sprintf("fixture claude ok: peers=0, prompt %d bytes", longSize), st.Result)
		require.Len(t, runs[id("long")].prompt, longSize)
		require.True(t, st.BridgeConnected)
		require.NotContains(t, strings.Join(st.Receipt.Argv, " "), "all work and no play", "the prompt is in no argument")
	})

	t.Run("mcp server failed", func(t *testing.T) {
		st := states[id("mcp-failed")]
		require.Equal(t, messages.StateFailed, st.State)
		require.Contains(t, st.Reason, `reports MCP server jetcrew as "failed"`)
		require.False(t, st.BridgeConnected)
		require.Less(t, st.FinishedAt.Sub(st.StartedAt), 20*time.Second,
			"stopped on the CLI's init event, not at its 40s bridge deadline")
		require.Equal(t, map[string]string{messages.MCPServerName: "failed"}, st.Agent.MCPServers)
		requireBackendReceipt(t, st.Receipt, backendCases[0], "claude-mcp-failed", bridge)
	})

	t.Run("bridge never started", func(t *testing.T) {
		st := states[id("no-bridge")]
		require.Equal(t, messages.StateFailed, st.State)
		require.Contains(t, st.Reason, "did not start the jetcrew MCP server within 3s")
		require.False(t, st.BridgeConnected)
		require.Less(t, st.FinishedAt.Sub(st.StartedAt), 25*time.Second, "stopped at its 3s bridge deadline, not at its 40s stall timeout")
		requireBackendReceipt(t, st.Receipt, backendCases[1], "codex-no-bridge", bridge)
		require.Equal(t, "3s", st.Receipt.BridgeDeadline)
	})

	t.Run("stalled", func(t *testing.T) {
		st := states[id("stall")]
		require.Equal(t, messages.StateStalled, st.State, st.Reason)
		require.Contains(t, st.Reason, "no progress")
		require.True(t, st.BridgeConnected, "it started the bridge before going quiet")
		require.Less(t, st.FinishedAt.Sub(st.StartedAt), 25*time.Second)
		require.Equal(t, "3s", st.Receipt.StallTimeout)
	})

	t.Run("missing image", func(t *testing.T) {
		st := states[id("no-image")]
		require.Equal(t, messages.StateFailed, st.State)
		require.Contains(t, st.Reason, `image "jetcrew-nope:latest" not found on this Docker engine`)
		require.Equal(t, 1, st.Attempts, "a missing image is not retried")
		require.NotNil(t, st.Receipt)
		require.Equal(t, "jetcrew-nope:latest", st.Receipt.Image)
		require.Empty(t, st.Receipt.ImageID)
		requireBackendReceipt(t, st.Receipt, backendCases[0], "claude-no-image", bridge)
	})

	t.Run("dead letters", func(t *testing.T) {
		for _, name := range []string{"mcp-failed", "no-bridge", "stall", "no-image"} {
			rid := id(name)
			var found []storedMsg
			for _, m := range msgs {
				if m.subject == messages.SubjectFailed(messages.DefaultPool, rid) {
					found = append(found, m)
				}
			}
			require.Len(t, found, 1, "%s has one dead letter", rid)
			var rc messages.Receipt
			require.NoError(t, json.Unmarshal([]byte(found[0].header.Get(messages.HeaderReceipt)), &rc))
			require.Equal(t, runs[rid].profile, rc.Profile)
			require.Equal(t, string(states[rid].State), found[0].header.Get(messages.HeaderState))
		}
	})

	t.Run("no secret anywhere", func(t *testing.T) {
		for rid, s := range stateJSON {
			require.NotContains(t, s, backendSecret, "state of %s", rid)
		}
		require.NotEmpty(t, msgs)
		streams := map[string]int{}
		for _, m := range msgs {
			streams[m.stream]++
			require.False(t, bytes.Contains(m.data, []byte(backendSecret)), "stream %s, subject %s holds the secret", m.stream, m.subject)
			for k, vs := range m.header {
				for _, v := range vs {
					require.NotContains(t, v, backendSecret, "stream %s, subject %s, header %s", m.stream, m.subject, k)
				}
			}
		}
		for _, s := range []string{messages.StreamEvents, messages.StreamFailed, "KV_" + messages.BucketRuns} {
			require.NotZero(t, streams[s], "stream %s was searched (streams: %v)", s, streams)
		}
		log := workerLog.String()
		require.Contains(t, log, "run finished", "the worker's log was captured")
		require.NotContains(t, log, backendSecret, "the worker's log")
	})
	t.Logf("TestBackends took %s", time.Since(started).Round(time.Millisecond))
}
