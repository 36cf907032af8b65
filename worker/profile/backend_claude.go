package profile

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
)

// BackendClaude runs Claude Code: claude -p --output-format stream-json
// --verbose --mcp-config <file> --strict-mcp-config, with coordination on
// also --input-format stream-json: the prompt and the operator's steers
// reach it as user turns on its standard input (Plan.SteerInput).
const BackendClaude = "claude"

func init() { registerBackend(BackendClaude, claudeBackend{}) }

// claudeBackend is Claude Code. Its init event lists each MCP server's
// status, which proves (or disproves) the bridge at once.
type claudeBackend struct{}

func (claudeBackend) plan(p Profile, _ string, coord bool, exe func(string) []string, plan *Plan) (bool, error) {
	plan.Argv = append(exe("claude"), "-p", "--output-format", "stream-json", "--verbose")
	if coord {
		// Claude Code's documented streamed input: one JSON user message
		// a line, read until its standard input ends.
		plan.Argv = append(plan.Argv, "--input-format", "stream-json")
		plan.SteerInput = messages.SteerInputClaude
		plan.Argv = append(plan.Argv, "--mcp-config", messages.ContainerMCPConfigPath, "--strict-mcp-config")
		plan.InitCheck = true
	} else {
		// An empty config with --strict-mcp-config: no MCP server at
		// all, not whatever the image's user settings list.
		none := messages.ContainerRunDir + "/mcp-none.json"
		plan.Files = append(plan.Files, StagedFile{Path: none, Mode: 0o444, Data: []byte(`{"mcpServers":{}}`)})
		plan.Argv = append(plan.Argv, "--mcp-config", none, "--strict-mcp-config")
	}
	switch p.PermissionMode {
	case "", "bypassPermissions":
		plan.Argv = append(plan.Argv, "--dangerously-skip-permissions")
	default:
		plan.Argv = append(plan.Argv, "--permission-mode", p.PermissionMode)
	}
	return false, nil
}

func (claudeBackend) parse(kind string, v map[string]any, ps *Parser) (string, string) {
	text := ""
	// Every event names the session; the latest wins (noteSessionID): a
	// run stopped before its result has it from its last message.
	ps.noteSessionID(jstr(v, "session_id"))
	switch kind {
	case "system":
		kind += "/" + jstr(v, "subtype")
		if jstr(v, "subtype") == "init" {
			servers, _ := v["mcp_servers"].([]any)
			ps.summary.MCPServers = map[string]string{}
			for _, s := range servers {
				if m, ok := s.(map[string]any); ok {
					ps.summary.MCPServers[jstr(m, "name")] = jstr(m, "status")
				}
			}
			ps.reportMCP(ps.summary.MCPServers[messages.MCPServerName])
		}
	case "assistant":
		if msg, ok := v["message"].(map[string]any); ok {
			text = textParts(msg)
		}
		ps.reportAnswer(claudeAnswer(v, text))
	case "result":
		ps.final = jstr(v, "result")
		text = ps.final
		ps.summary.IsError, _ = v["is_error"].(bool)
		ps.reportAnswer(claudeAnswer(v, text))
		ps.summary.CostUSD, _ = v["total_cost_usd"].(float64)
		if n, ok := v["num_turns"].(float64); ok {
			ps.summary.Turns = int(n)
		}
	}
	return kind, text
}

func (claudeBackend) structured() bool { return true }

// claudeAnswer is the answer an assistant event or a result v of text
// holds: Claude Code marks the model API's error in place of an answer
// with is_api_error_message (an assistant event) or terminal_reason
// api_error and api_error_status (a result), its text "API Error: NNN
// BODY" (the recorded output's authentication failure has no status).
func claudeAnswer(v map[string]any, text string) Answer {
	apiErr, _ := v["is_api_error_message"].(bool)
	if !apiErr && jstr(v, "terminal_reason") != "api_error" {
		return Answer{}
	}
	status := apiErrorStatus(text)
	if n, ok := v["api_error_status"].(float64); ok && n >= 100 && n < 600 {
		status = int(n)
	}
	if status == 0 {
		return Answer{}
	}
	return Answer{APIStatus: status, Text: text}
}

// sessionDir: Claude Code keeps each session as
// ~/.claude/projects/<the working directory, slashes as dashes>/<session id>.jsonl.
func (claudeBackend) sessionDir(p Profile) (string, []string, []string) {
	return p.Home + "/.claude/projects", nil, nil
}

// holds: <project directory>/<id>.jsonl.
func (claudeBackend) holds(names []string, id string) bool {
	return slices.ContainsFunc(names, func(n string) bool {
		dir, file := path.Split(n)
		return file == id+".jsonl" && dir != "" && !strings.Contains(strings.TrimSuffix(dir, "/"), "/")
	})
}

// resume: `claude -p --resume SESSION_ID` (Claude Code's CLI reference).
func (claudeBackend) resume(argv []string, id string) []string { return append(argv, "--resume", id) }

// validate checks permission_mode: one of Claude Code's documented modes.
func (claudeBackend) validate(a AgentConfig) error {
	switch a.PermissionMode {
	case "", "default", "acceptEdits", "bypassPermissions", "plan", "dontAsk":
		return nil
	}
	return fmt.Errorf("permission_mode %q is not one of default, acceptEdits, bypassPermissions, plan, dontAsk", a.PermissionMode)
}
