package profile

import (
	"github.com/jetcrew/jetcrew/messages"
)

// BackendKimi runs Kimi CLI: kimi --print --output-format stream-json
// --mcp-config-file <file>, with coordination on also --input-format
// stream-json: Kimi then reads user messages from its standard input until
// it ends, the prompt and the operator's steers (Plan.SteerInput).
const BackendKimi = "kimi"

func init() { registerBackend(BackendKimi, kimiBackend{}) }

// kimiBackend is Kimi CLI.
type kimiBackend struct{}

func (kimiBackend) plan(_ Profile, _ string, coord bool, exe func(string) []string, plan *Plan) (bool, error) {
	plan.Argv = append(exe("kimi"), "--print", "--output-format", "stream-json")
	if coord {
		plan.Argv = append(plan.Argv, "--input-format", "stream-json", "--mcp-config-file", messages.ContainerMCPConfigPath)
		plan.SteerInput = messages.SteerInputKimi
	}
	return false, nil
}

func (kimiBackend) parse(kind string, v map[string]any, ps *Parser) (string, string) {
	text := ""
	if jstr(v, "role") == "assistant" {
		if s := jstr(v, "content"); s != "" {
			text = s
			ps.final = s
		}
	}
	if kind == "" {
		kind = jstr(v, "role")
	}
	return kind, text
}

func (kimiBackend) structured() bool { return true }

// validate has nothing to check: the CLI reads no key of its own.
func (kimiBackend) validate(AgentConfig) error { return nil }
