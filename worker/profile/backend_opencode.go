package profile

import (
	"encoding/json"
	"path"
	"slices"

	"github.com/jetcrew/jetcrew/messages"
)

// BackendOpencode runs opencode: opencode run --format json with the MCP
// entry in OPENCODE_CONFIG_CONTENT.
const BackendOpencode = "opencode"

func init() { registerBackend(BackendOpencode, opencodeBackend{}) }

// opencodeBackend is opencode.
type opencodeBackend struct{}

func (opencodeBackend) plan(_ Profile, _ string, coord bool, exe func(string) []string, plan *Plan) (bool, error) {
	cfg := map[string]any{"mcp": map[string]any{}}
	if coord {
		cfg["mcp"] = map[string]any{messages.MCPServerName: map[string]any{"type": "local", "command": []string{messages.ContainerBridgePath}, "enabled": true}}
	}
	b, _ := json.Marshal(cfg)
	plan.Env = append(plan.Env, "OPENCODE_CONFIG_CONTENT="+string(b))
	plan.Argv = append(exe("opencode"), "run", "--format", "json")
	return false, nil
}

func (opencodeBackend) parse(kind string, v map[string]any, ps *Parser) (string, string) {
	text := ""
	ps.noteSessionID(jstr(v, "sessionID"))
	if part, ok := v["part"].(map[string]any); ok && jstr(part, "type") == "text" {
		text = jstr(part, "text")
		ps.final = text
	}
	return kind, text
}

func (opencodeBackend) structured() bool { return true }

// sessionDir: opencode keeps its sessions, messages and parts under
// $XDG_DATA_HOME/opencode (~/.local/share/opencode): in storage/ and
// project/<slug>/storage/ (files), and in opencode.db (SQLite) in newer
// versions. The whole directory is kept but auth.json (credentials), log/
// and bin/ (downloaded tools).
func (opencodeBackend) sessionDir(p Profile) (string, []string, []string) {
	return p.Home + "/.local/share/opencode", nil, []string{"auth.json", "bin", "log"}
}

// holds: the session's info file (storage/session/.../<id>.json, in older
// versions under project/<slug>/) or opencode.db, where newer versions
// keep every session.
func (opencodeBackend) holds(names []string, id string) bool {
	return slices.ContainsFunc(names, func(n string) bool { return n == "opencode.db" || path.Base(n) == id+".json" })
}

// resume: `opencode run --session SESSION_ID` (opencode's CLI reference).
func (opencodeBackend) resume(argv []string, id string) []string {
	return append(argv, "--session", id)
}

// validate has nothing to check: the CLI reads no key of its own.
func (opencodeBackend) validate(AgentConfig) error { return nil }
