package profile

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// The session id each CLI prints is kept, from the recorded output of the
// real CLIs where there is one; an id that could pass for an option is not.
func TestParserSessionID(t *testing.T) {
	t.Parallel()
	_, sum, _, _ := parseFile(t, BackendClaude, "claude-2.1.332-connected-not-logged-in.jsonl")
	require.True(t, messages.ValidSessionID(sum.SessionID), sum.SessionID)
	_, sum, _, _ = parseFile(t, BackendCodex, "codex-0.171.0-no-network.jsonl")
	require.Equal(t, "01a22b97-bbfd-7880-a501-dba2b5371ab8", sum.SessionID)
	// A resumed Claude Code session: init names the id resumed, the
	// result the new one the conversation went on under.
	p := NewParser(BackendClaude, func(messages.AgentEvent) {}, nil)
	p.Feed([]byte(`{"type":"system","subtype":"init","session_id":"old-1"}` + "\n" +
		`{"type":"result","is_error":false,"result":"ok","session_id":"new-2"}` + "\n"))
	_, sum = p.Outcome()
	require.Equal(t, "new-2", sum.SessionID, "the id the CLI reported last")
	for b, line := range map[string]string{
		BackendOpencode: `{"type":"text","sessionID":"ses_abc123","part":{"type":"text","text":"x"}}`,
		BackendClaude:   `{"type":"system","subtype":"init","session_id":"--dangerously-x"}`,
	} {
		p := NewParser(b, func(messages.AgentEvent) {}, nil)
		p.Feed([]byte(line + "\n"))
		_, sum := p.Outcome()
		if b == BackendOpencode {
			require.Equal(t, "ses_abc123", sum.SessionID)
		} else {
			require.Empty(t, sum.SessionID, "an id starting with '-' is refused")
		}
	}
}

// Each backend that can resume passes its CLI's documented flag; the
// others cannot resume, and say so.
func TestResume(t *testing.T) {
	t.Parallel()
	for backend, want := range map[string][]string{
		BackendClaude:   {"claude", "-p", "--output-format", "stream-json", "--verbose", "--mcp-config", "/run/jetcrew/mcp-none.json", "--strict-mcp-config", "--dangerously-skip-permissions", "--model", "m", "--resume", "s-1"},
		BackendCodex:    {"codex", "exec", "--json", "--skip-git-repo-check", "resume", "s-1", "-", "--model", "m"},
		BackendOpencode: {"opencode", "run", "--format", "json", "--model", "m", "--session", "s-1"},
	} {
		p, err := Profile{Name: backend, JailConfig: JailConfig{Image: "x"}, AgentConfig: AgentConfig{Backend: backend, Args: []string{"--model", "m"}}}.Resolve()
		require.NoError(t, err)
		require.True(t, p.CanResume())
		plan, err := p.Plan("task", false)
		require.NoError(t, err)
		require.Contains(t, plan.SessionDir, "/home/agent/.", backend)
		resumed, err := p.Resume(plan, "s-1")
		require.NoError(t, err)
		require.Equal(t, want, resumed.Argv, backend)
		_, err = p.Resume(plan, "-x")
		require.ErrorContains(t, err, "not one jetcrew passes")
	}
	for _, backend := range []string{BackendGemini, BackendKimi, BackendPi, BackendCommand} {
		p := Profile{AgentConfig: AgentConfig{Backend: backend}}
		require.False(t, p.CanResume(), backend)
		_, err := p.Resume(Plan{}, "s-1")
		require.ErrorContains(t, err, "cannot resume", backend)
		plan, err := Profile{AgentConfig: AgentConfig{Backend: backend, Command: []string{"x"}}}.Plan("t", false)
		require.NoError(t, err)
		require.Empty(t, plan.SessionDir, backend)
	}
}

// A kept session holds a session id only where the CLI looks it up on
// resume: Codex needs its rollout and its state database.
func TestHoldsSession(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		backend string
		names   []string
		id      string
		want    bool
	}{
		{BackendClaude, []string{"-workspace/s-1.jsonl"}, "s-1", true},
		{BackendClaude, []string{"-workspace/s-2.jsonl", "-workspace/s-1.jsonl.bak"}, "s-1", false},
		{BackendClaude, []string{"s-1.jsonl"}, "s-1", false},
		{BackendCodex, []string{"sessions/2026/01/02/rollout-2026-01-02T03-04-05-t-1.jsonl", "state_5.sqlite"}, "t-1", true},
		{BackendCodex, []string{"sessions/2026/01/02/rollout-2026-01-02T03-04-05-t-1.jsonl"}, "t-1", false},
		{BackendCodex, []string{"2026/01/02/rollout-2026-01-02T03-04-05-t-1.jsonl", "state_5.sqlite"}, "t-1", false},
		{BackendOpencode, []string{"storage/session/info/ses_1.json"}, "ses_1", true},
		{BackendOpencode, []string{"opencode.db"}, "ses_1", true},
		{BackendOpencode, []string{"storage/message/ses_2/m.json"}, "ses_1", false},
		{BackendGemini, []string{"x"}, "x", false},
	} {
		require.Equal(t, c.want, AgentConfig{Backend: c.backend}.HoldsSession(c.names, c.id), "%s %v %s", c.backend, c.names, c.id)
	}
}

// The parser reports the CLI's first answer once: the model API's refusal
// with its status (Claude Code's api_error_status, else its "API Error:
// NNN" text), or a model's answer; the recorded authentication failure
// carries no status.
func TestParserFirstAnswer(t *testing.T) {
	t.Parallel()
	feed := func(lines ...string) []Answer {
		var got []Answer
		p := NewParser(BackendClaude, func(messages.AgentEvent) {}, nil)
		p.OnFirstAnswer(func(a Answer) { got = append(got, a) })
		p.Feed([]byte(strings.Join(lines, "\n") + "\n"))
		return got
	}
	refusal := `API Error: 400 {"type":"error","error":{"type":"invalid_request_error","message":"messages.1: The final block in an assistant message cannot be ` + "`thinking`" + `."}}`
	init := `{"type":"system","subtype":"init","session_id":"s-1"}`
	assistantErr := `{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":` + strconv.Quote(refusal) + `}]},"error":"invalid_request","is_api_error_message":true,"session_id":"s-2"}`
	result := `{"type":"result","is_error":true,"terminal_reason":"api_error","api_error_status":400,"result":` + strconv.Quote(refusal) + `}`
	require.Equal(t, []Answer{{APIStatus: 400, Text: refusal}}, feed(init, assistantErr, result))
	require.Equal(t, []Answer{{APIStatus: 400, Text: refusal}}, feed(init, result), "the result alone")
	require.Equal(t, []Answer{{}}, feed(init, `{"type":"assistant","message":{"content":[{"type":"text","text":"hi"}]}}`, result), "a model's answer first")

	var got []Answer
	p := NewParser(BackendClaude, func(messages.AgentEvent) {}, nil)
	p.OnFirstAnswer(func(a Answer) { got = append(got, a) })
	b, err := os.ReadFile("testdata/agent-output/claude-2.1.332-connected-not-logged-in.jsonl")
	require.NoError(t, err)
	p.Feed(b)
	require.Equal(t, []Answer{{}}, got, "no status: no refusal of the request itself")
}
