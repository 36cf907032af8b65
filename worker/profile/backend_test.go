package profile

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// backendGolden is what a backend makes of the reference profile and run:
// the argv, the environment names and the files written.
type backendGolden struct {
	Argv        []string          `json:"argv"`
	EnvNames    []string          `json:"env_names"`
	BackendEnv  []string          `json:"backend_env"`
	Files       map[string]string `json:"files"`
	FileModes   map[string]string `json:"file_modes"`
	Mounts      []Mount           `json:"mounts"`
	MCPServers  []string          `json:"mcp_servers"`
	Unsupported []string          `json:"unsupported,omitempty"`
}

func TestBackendGolden(t *testing.T) {
	t.Parallel()
	for _, b := range Backends() {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			p := Profile{Name: "ref", Backend: b, Image: "agents:ref", EnvFromHost: []string{"API_KEY"}}
			if b == BackendCommand {
				p.Command = []string{"/bin/sh", "-c", "{prompt}"}
			}
			p, err := p.withDefaults()
			require.NoError(t, err)
			require.NoError(t, p.validate())
			plan, err := p.Plan("fix the bug", true)
			require.NoError(t, err)
			spec, err := BuildSpec(SpecInput{
				Profile: p, Plan: plan, Coordination: true,
				Request: messages.RunRequest{ID: "r1", Profile: "ref", Prompt: "fix the bug", Group: "g"}.WithDefaults(),
				Attempt: 1, WorkerID: "w", Now: time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC),
				RunDir: "/state/r/x", BridgePath: "/usr/local/bin/jetcrew-bridge",
				LookupEnv: func(string) (string, bool) { return "sk-secret", true },
			})
			require.NoError(t, err)
			g := backendGolden{Argv: spec.Cmd, BackendEnv: plan.Env, Files: map[string]string{}, FileModes: map[string]string{},
				Mounts: spec.Mounts, MCPServers: plan.MCPServers, Unsupported: plan.Unsupported}
			for _, kv := range spec.Env {
				k, _, _ := strings.Cut(kv, "=")
				g.EnvNames = append(g.EnvNames, k)
				require.NotContains(t, kv, "fix the bug", "the prompt never travels in the environment")
			}
			sort.Strings(g.EnvNames)
			for _, f := range plan.Files {
				g.Files[f.Path] = string(f.Data)
				g.FileModes[f.Path] = f.Mode.String()
				// Every file lives in the jail-visible, read-only run dir.
				require.True(t, strings.HasPrefix(f.Path, "/run/jetcrew/"), f.Path)
			}
			got, err := json.MarshalIndent(g, "", "  ")
			require.NoError(t, err)
			got = append(got, '\n')
			path := filepath.Join("testdata", "backend-"+b+".json")
			if *update {
				require.NoError(t, os.WriteFile(path, got, 0o644))
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Equal(t, string(want), string(got))
			// The secret reaches the container by name only in receipts.
			rc := buildReceipt(p, plan, spec, time.Hour, "fix the bug")
			rb, _ := json.Marshal(rc)
			require.NotContains(t, string(rb), "sk-secret")
			require.NotContains(t, string(rb), "fix the bug")
			require.Contains(t, rc.EnvNames, "API_KEY")
			if b != BackendCommand {
				require.Contains(t, strings.Join(spec.Cmd, " "), "launch --stdin /run/jetcrew/prompt", "agent CLIs read the prompt on stdin")
				require.NotContains(t, spec.Cmd, "fix the bug", "the prompt is never an argument of an agent CLI")
			}
		})
	}
}

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
