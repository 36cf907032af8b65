package profile

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
)

// BackendCodex runs Codex CLI: codex exec --json with a writable CODEX_HOME
// holding config.toml's [mcp_servers.jetcrew].
const BackendCodex = "codex"

func init() { registerBackend(BackendCodex, codexBackend{}) }

// codexBackend is Codex CLI.
type codexBackend struct{}

func (codexBackend) plan(p Profile, _ string, coord bool, exe func(string) []string, plan *Plan) (bool, error) {
	plan.Argv = append(exe("codex"), "exec", "--json", "--skip-git-repo-check")
	var toml strings.Builder
	if coord {
		fmt.Fprintf(&toml, "[mcp_servers.%s]\ncommand = %q\nargs = []\nstartup_timeout_sec = 30\ntool_timeout_sec = 60\n",
			messages.MCPServerName, messages.ContainerBridgePath)
	}
	plan.Files = append(plan.Files, StagedFile{Path: HomeSeedPath + "/.codex/config.toml", Mode: 0o444, Data: []byte(toml.String())})
	plan.Env = append(plan.Env, "CODEX_HOME="+p.Home+"/.codex")
	// "-": codex exec reads the prompt from standard input.
	plan.Argv = append(plan.Argv, "-")
	return false, nil
}

func (codexBackend) parse(kind string, v map[string]any, ps *Parser) (string, string) {
	text := ""
	switch kind {
	case "thread.started":
		ps.noteSessionID(jstr(v, "thread_id"))
	case "item.completed":
		if item, ok := v["item"].(map[string]any); ok && jstr(item, "type") == "agent_message" {
			ps.final = jstr(item, "text")
			text = ps.final
		}
	case "turn.failed":
		ps.summary.IsError = true
		if e, ok := v["error"].(map[string]any); ok {
			text = jstr(e, "message")
		}
	case "error":
		text = jstr(v, "message")
	case "turn.completed":
		ps.summary.Turns++
	}
	return kind, text
}

func (codexBackend) structured() bool { return true }

// sessionDir: Codex keeps a session as a rollout file under
// $CODEX_HOME/sessions (sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl),
// CODEX_HOME being ~/.codex here, and from 0.137 resolves `exec resume ID`
// through its thread index, the threads table of its state database
// $CODEX_HOME/state_5.sqlite (a row naming the rollout's path): a restored
// sessions/ alone gives "no rollout found for thread id"
// (openai/codex#40426, vm0-ai/vm0#16125). Both are kept, and the
// database's write-ahead log (state_5.sqlite-wal: a CLI stopped before it
// checkpointed has its rows there); the shared-memory index (-shm) is
// rebuilt by SQLite. Nothing else of CODEX_HOME is: auth.json
// (credentials), config.toml (the worker seeds its own), its logs and
// other databases (logs_*, memories_*, thread_history_* are rebuilt or
// not needed to resume). The pattern takes the schema version that
// follows 5.
func (codexBackend) sessionDir(p Profile) (string, []string, []string) {
	return p.Home + "/.codex", []string{"sessions", "state_*.sqlite", "state_*.sqlite-wal"}, nil
}

// holds: a rollout of thread id under sessions/ (rollout-<time>-<id>.jsonl,
// or .jsonl.zst as Codex compresses an older one) and the state database
// that indexes it.
func (codexBackend) holds(names []string, id string) bool {
	rollout := slices.ContainsFunc(names, func(n string) bool {
		base := path.Base(n)
		return strings.HasPrefix(n, "sessions/") && strings.HasPrefix(base, "rollout-") &&
			(strings.HasSuffix(base, "-"+id+".jsonl") || strings.HasSuffix(base, "-"+id+".jsonl.zst"))
	})
	index := slices.ContainsFunc(names, func(n string) bool { ok, _ := path.Match("state_*.sqlite", n); return ok })
	return rollout && index
}

// resume: `codex exec [OPTIONS] resume SESSION_ID -` (Codex's exec
// reference): the "-" that reads the prompt from standard input becomes
// "resume ID -".
func (codexBackend) resume(argv []string, id string) []string {
	if i := slices.Index(argv, "-"); i >= 0 {
		return slices.Insert(argv, i, "resume", id)
	}
	return append(argv, "resume", id, "-")
}

// validate has nothing to check: the CLI reads no key of its own.
func (codexBackend) validate(AgentConfig) error { return nil }
