package profile

import (
	"fmt"

	"github.com/jetcrew/jetcrew/messages"
)

// BackendGemini runs Gemini CLI: gemini --output-format stream-json with the
// MCP server in the system settings file it documents
// (GEMINI_CLI_SYSTEM_SETTINGS_PATH).
const BackendGemini = "gemini"

func init() { registerBackend(BackendGemini, geminiBackend{}) }

// geminiBackend is Gemini CLI.
type geminiBackend struct{}

func (geminiBackend) plan(p Profile, _ string, coord bool, exe func(string) []string, plan *Plan) (bool, error) {
	settings := map[string]any{"security": map[string]any{"folderTrust": map[string]any{"enabled": false}}}
	if coord {
		settings["mcpServers"] = map[string]any{messages.MCPServerName: map[string]any{"command": messages.ContainerBridgePath, "trust": true}}
	} else {
		settings["mcpServers"] = map[string]any{}
	}
	// /run/jetcrew is 0755 and read-only: Gemini CLI skips a settings
	// file under a group- or world-writable directory.
	path := messages.ContainerRunDir + "/gemini-settings.json"
	plan.Files = append(plan.Files, jsonFile(path, settings))
	plan.Env = append(plan.Env, "GEMINI_CLI_SYSTEM_SETTINGS_PATH="+path)
	mode := p.ApprovalMode
	if mode == "" {
		mode = "yolo"
	}
	plan.Argv = append(exe("gemini"), "--output-format", "stream-json", "--approval-mode", mode)
	return false, nil
}

func (geminiBackend) parse(kind string, v map[string]any, ps *Parser) (string, string) {
	text := ""
	switch kind {
	case "message":
		if jstr(v, "role") == "assistant" {
			text = jstr(v, "content")
			ps.result.WriteString(text)
		}
	case "result":
		ps.summary.IsError = jstr(v, "status") == "error"
	case "error":
		text = jstr(v, "message")
	}
	return kind, text
}

func (geminiBackend) structured() bool { return true }

// validate checks approval_mode: one of Gemini CLI's --approval-mode values.
func (geminiBackend) validate(a AgentConfig) error {
	switch a.ApprovalMode {
	case "", "default", "auto_edit", "yolo":
		return nil
	}
	return fmt.Errorf("approval_mode %q is not one of default, auto_edit, yolo", a.ApprovalMode)
}
