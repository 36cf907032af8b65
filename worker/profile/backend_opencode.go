package profile

import (
	"encoding/json"

	"github.com/jetcrew/jetcrew/coordination"
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
		cfg["mcp"] = map[string]any{coordination.MCPServerName: map[string]any{"type": "local", "command": []string{coordination.BridgePath}, "enabled": true}}
	}
	b, _ := json.Marshal(cfg)
	plan.Env = append(plan.Env, "OPENCODE_CONFIG_CONTENT="+string(b))
	plan.Argv = append(exe("opencode"), "run", "--format", "json")
	return false, nil
}

func (opencodeBackend) parse(kind string, v map[string]any, ps *Parser) (string, string) {
	text := ""
	if part, ok := v["part"].(map[string]any); ok && jstr(part, "type") == "text" {
		text = jstr(part, "text")
		ps.final = text
	}
	return kind, text
}

func (opencodeBackend) structured() bool { return true }

// validate has nothing to check: the CLI reads no key of its own.
func (opencodeBackend) validate(Profile) error { return nil }
