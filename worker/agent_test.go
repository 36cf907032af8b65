package worker_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

func agentProfiles(t *testing.T, extra string) profile.Profiles {
	t.Helper()
	ps, err := profile.ParseProfiles("agents.toml", []byte(`
[profiles.claude]
backend = "claude"
image = "agents:test"
bridge_deadline = "300ms"
stall_timeout = "1s"
[profiles.codex]
backend = "codex"
image = "agents:test"
bridge_deadline = "300ms"
stall_timeout = "400ms"
`+extra))
	require.NoError(t, err)
	return ps
}

func recorded(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("profile/testdata/agent-output/" + name)
	require.NoError(t, err)
	return b
}

// Claude Code carries on without a failed MCP server; jetcrew does not: the
// run ends at once, failed, with the reason, and the receipt.
func TestClaudeFailedBridgeStopsRun(t *testing.T) {
	t.Parallel()
	out := recorded(t, "claude-2.1.332-bridge-failed-not-logged-in.jsonl")
	b := setup(t, func(c *worker.Config) {
		c.Profiles = agentProfiles(t, "")
		rt := workertest.NewTestRuntime(t)
		rt.Behave = func(jail.ContainerSpec) (workertest.Behaviour, error) {
			return func(ctx context.Context, _ jail.ContainerSpec, o jail.OutputFunc) jail.ExitStatus {
				o("stdout", out[:bytes.IndexByte(out, '\n')+1]) // the init event, and then it would work on
				<-ctx.Done()
				return jail.ExitStatus{Code: 143}
			}, nil
		}
		c.Runtime = rt
	})
	b.submit(t, messages.RunRequest{ID: "cl1", Profile: "claude", Prompt: "say hi"})
	st := b.waitFinal(t, "cl1")
	require.Equal(t, messages.StateFailed, st.State)
	require.Contains(t, st.Reason, `reports MCP server jetcrew as "failed"`)
	require.NotNil(t, st.Receipt)
	require.Equal(t, "claude", st.Receipt.Backend)
	require.Equal(t, []string{"jetcrew"}, st.Receipt.MCPServers)
	require.Equal(t, "failed", st.Agent.MCPServers["jetcrew"])
}

// With the server connected, the result event's text becomes the run's
// result and its error the reason.
func TestClaudeResultExtracted(t *testing.T) {
	t.Parallel()
	out := recorded(t, "claude-2.1.332-connected-not-logged-in.jsonl")
	b := setup(t, func(c *worker.Config) {
		c.Profiles = agentProfiles(t, "")
		rt := workertest.NewTestRuntime(t)
		rt.Behave = func(jail.ContainerSpec) (workertest.Behaviour, error) {
			return func(ctx context.Context, _ jail.ContainerSpec, o jail.OutputFunc) jail.ExitStatus {
				o("stdout", out)
				return jail.ExitStatus{Code: 1}
			}, nil
		}
		c.Runtime = rt
	})
	b.submit(t, messages.RunRequest{ID: "cl2", Profile: "claude", Prompt: "say hi"})
	st := b.waitFinal(t, "cl2")
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, "Not logged in · Please run /login", st.Result)
	require.Equal(t, "exit code 1: the agent reported: Not logged in · Please run /login", st.Reason)
	require.True(t, st.Agent.IsError)
	var agentKinds int
	for _, m := range b.events(t, "cl2") {
		if m.Subject() == messages.SubjectEvents("cl2", messages.EventAgent) {
			agentKinds++
		}
	}
	require.Equal(t, 3, agentKinds)
}

// Codex with no network prints a few events and then waits forever: the
// bridge deadline, then the stall watchdog, stop it.
func TestCodexNoBridgeAndStall(t *testing.T) {
	t.Parallel()
	out := recorded(t, "codex-0.171.0-no-network.jsonl")
	b := setup(t, func(c *worker.Config) {
		c.Profiles = agentProfiles(t, "[profiles.codex-nodeadline]\nbackend='codex'\nimage='agents:test'\nbridge_deadline='1h'\nstall_timeout='400ms'\n")
		rt := workertest.NewTestRuntime(t)
		rt.Behave = func(jail.ContainerSpec) (workertest.Behaviour, error) {
			return func(ctx context.Context, _ jail.ContainerSpec, o jail.OutputFunc) jail.ExitStatus {
				o("stdout", out)
				<-ctx.Done()
				return jail.ExitStatus{Code: 143}
			}, nil
		}
		c.Runtime = rt
	})
	b.submit(t, messages.RunRequest{ID: "cx1", Profile: "codex", Prompt: "hi"})
	st := b.waitFinal(t, "cx1")
	require.Equal(t, messages.StateFailed, st.State)
	require.Contains(t, st.Reason, "did not start the jetcrew MCP server within 300ms")

	b.submit(t, messages.RunRequest{ID: "cx2", Profile: "codex-nodeadline", Prompt: "hi"})
	start := time.Now()
	st = b.waitFinal(t, "cx2")
	require.Equal(t, messages.StateStalled, st.State)
	require.Contains(t, st.Reason, "no progress")
	require.Less(t, time.Since(start), 10*time.Second)
	b.deadLetter(t, "default", "cx2")
}

// A failure before the agent starts still returns the receipt.
func TestReceiptOnEarlyFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *worker.Config) {
		c.Profiles = agentProfiles(t, "")
		rt := workertest.NewTestRuntime(t)
		rt.Behave = func(jail.ContainerSpec) (workertest.Behaviour, error) {
			return nil, fmt.Errorf("image %q not found: %w", "agents:test", jail.ErrPermanent)
		}
		c.Runtime = rt
	})
	b.submit(t, messages.RunRequest{ID: "rc1", Profile: "codex", Prompt: "hi"})
	st := b.waitFinal(t, "rc1")
	require.Equal(t, messages.StateFailed, st.State)
	require.Contains(t, st.Reason, "not found")
	require.NotNil(t, st.Receipt)
	require.Equal(t, "agents:test", st.Receipt.Image)
	require.Equal(t, "codex", st.Receipt.Backend)
	require.NotEmpty(t, st.Receipt.Files)
	require.Equal(t, messages.ReceiptFile{Path: messages.ContainerMCPConfigPath, Mode: "0444"}, st.Receipt.Files[0],
		"the coordination stage lists mcp.json first, before the plan's files")
	require.Contains(t, st.Receipt.EnvNames, "CODEX_HOME")
	dl := b.deadLetter(t, "default", "rc1")
	require.Contains(t, dl.Header.Get(messages.HeaderReceipt), `"backend":"codex"`)
}
