package profile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

func TestCommandBackendRefusesHugeArgumentPrompt(t *testing.T) {
	t.Parallel()
	_, err := ShellProfile().Plan(strings.Repeat("x", maxArgPrompt+1), true)
	require.ErrorContains(t, err, "too long to pass as an argument")
	p := ShellProfile()
	p.Command = []string{"/bin/sh", "{prompt_file}"}
	plan, err := p.Plan(strings.Repeat("x", maxArgPrompt+1), true)
	require.NoError(t, err)
	require.Equal(t, []string{"/bin/sh", PromptPath}, plan.Argv)
}

func parseFile(t *testing.T, backend, name string) (string, *messages.AgentSummary, []messages.AgentEvent, []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "agent-output", name))
	require.NoError(t, err)
	var evs []messages.AgentEvent
	var mcp []string
	p := NewParser(backend, func(e messages.AgentEvent) { evs = append(evs, e) }, func(s string) { mcp = append(mcp, s) })
	// Feed in awkward chunks: lines split across writes.
	for len(data) > 0 {
		n := min(len(data), 777)
		p.Feed(data[:n])
		data = data[n:]
	}
	res, sum := p.Outcome()
	return res, sum, evs, mcp
}

// Golden inputs: real output recorded from the real CLIs.
func TestClaudeParserRecorded(t *testing.T) {
	t.Parallel()
	res, sum, evs, mcp := parseFile(t, BackendClaude, "claude-2.1.332-connected-not-logged-in.jsonl")
	require.Equal(t, "Not logged in · Please run /login", res)
	require.True(t, sum.IsError)
	require.Equal(t, 1, sum.Turns)
	require.Equal(t, map[string]string{"jetcrew": "connected"}, sum.MCPServers)
	require.Equal(t, []string{"connected"}, mcp)
	require.Equal(t, []string{"system/init", "assistant", "result"}, kinds(evs))

	_, sum, _, mcp = parseFile(t, BackendClaude, "claude-2.1.332-bridge-failed-not-logged-in.jsonl")
	require.Equal(t, []string{"failed"}, mcp, "a failed bridge is reported at once")
	require.Equal(t, "failed", sum.MCPServers["jetcrew"])
}

func TestCodexAndGeminiParserRecorded(t *testing.T) {
	t.Parallel()
	res, _, evs, _ := parseFile(t, BackendCodex, "codex-0.171.0-no-network.jsonl")
	require.Empty(t, res)
	require.Equal(t, []string{"thread.started", "turn.started", "error", "error"}, kinds(evs))
	require.Contains(t, evs[2].Text, "Reconnecting... 2/5")

	res, _, evs, _ = parseFile(t, BackendGemini, "gemini-0.61.0-no-network.jsonl")
	require.Empty(t, res, "the user's own message is not a result")
	require.Equal(t, []string{"init", "message"}, kinds(evs))
}

func TestParserOtherBackends(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		BackendCodex:    `{"type":"item.completed","item":{"id":"i1","type":"agent_message","text":"done: 3 files"}}`,
		BackendGemini:   `{"type":"message","role":"assistant","content":"done: 3 files","delta":true}`,
		BackendOpencode: `{"type":"text","part":{"type":"text","text":"done: 3 files"}}`,
		BackendKimi:     `{"role":"assistant","content":"done: 3 files"}`,
		BackendPi:       `{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"done: 3 files"}]}}`,
	}
	for b, line := range cases {
		p := NewParser(b, func(messages.AgentEvent) {}, nil)
		p.Feed([]byte("not json\n" + line + "\n"))
		res, _ := p.Outcome()
		require.Equal(t, "done: 3 files", res, b)
	}
	p := NewParser(BackendPi, func(messages.AgentEvent) {}, nil)
	p.Feed([]byte(`{"type":"agent_end","messages":[{"role":"user","content":[{"type":"text","text":"q"}]},{"role":"assistant","content":[{"type":"text","text":"all done"}]}]}` + "\n"))
	res, _ := p.Outcome()
	require.Equal(t, "all done", res, "pi's agent_end carries every message")
	require.Nil(t, NewParser(BackendCommand, nil, nil), "the command backend's output is not parsed")
}

func kinds(evs []messages.AgentEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Kind)
	}
	return out
}
