package profile

import "github.com/jetcrew/jetcrew/messages"

// BackendPi runs pi: pi --print --mode json, MCP through the pi-mcp-adapter
// configuration in ~/.pi/agent/mcp.json.
const BackendPi = "pi"

func init() { registerBackend(BackendPi, piBackend{}) }

// piBackend is pi.
type piBackend struct{}

func (piBackend) plan(_ Profile, _ string, coord bool, exe func(string) []string, plan *Plan) (bool, error) {
	plan.Argv = append(exe("pi"), "--print", "--mode", "json")
	cfg := map[string]any{"mcpServers": map[string]any{}}
	if coord {
		cfg["mcpServers"] = map[string]any{messages.MCPServerName: map[string]any{"command": messages.ContainerBridgePath, "args": []string{}}}
	}
	plan.Files = append(plan.Files, jsonFile(HomeSeedPath+"/.pi/agent/mcp.json", cfg))
	plan.Unsupported = append(plan.Unsupported, "pi has no built-in MCP client: the image must include the pi-mcp-adapter extension, which reads ~/.pi/agent/mcp.json")
	return false, nil
}

func (piBackend) parse(kind string, v map[string]any, ps *Parser) (string, string) {
	// message_end carries one message; agent_end all of the run's.
	var msgs []any
	switch kind {
	case "message_end":
		msgs = []any{v["message"]}
	case "agent_end":
		msgs, _ = v["messages"].([]any)
	}
	text := ""
	for _, mv := range msgs {
		msg, ok := mv.(map[string]any)
		if !ok || jstr(msg, "role") != "assistant" {
			continue
		}
		if t := textParts(msg); t != "" {
			text, ps.final = t, t
		}
	}
	return kind, text
}

func (piBackend) structured() bool { return true }

// validate has nothing to check: the CLI reads no key of its own.
func (piBackend) validate(AgentConfig) error { return nil }
