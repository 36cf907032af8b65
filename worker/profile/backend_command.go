package profile

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
)

// BackendCommand runs the profile's Command with {prompt} (or
// {prompt_file}, {mcp_config}) substituted; the MCP config path is also in
// JETCREW_MCP_CONFIG. Its output is not parsed. The built-in shell profile
// uses it.
const BackendCommand = "command"

func init() { registerBackend(BackendCommand, commandBackend{}) }

// commandBackend runs the profile's own argv.
type commandBackend struct{}

// Placeholders substituted in a command profile's argv.
const (
	placeholderPrompt     = "{prompt}"
	placeholderPromptFile = "{prompt_file}"
	placeholderMCPConfig  = "{mcp_config}"
)

func (commandBackend) plan(p Profile, prompt string, coord bool, _ func(string) []string, plan *Plan) (bool, error) {
	usesFile := false
	for _, a := range p.Command {
		if strings.Contains(a, placeholderPrompt) && len(prompt) > maxArgPrompt {
			return true, fmt.Errorf("prompt is %d bytes, more than %d, too long to pass as an argument; give the profile {prompt_file} or prompt_stdin = true", len(prompt), maxArgPrompt)
		}
		if strings.Contains(a, placeholderMCPConfig) && !coord {
			return true, fmt.Errorf("command uses %s but the profile has coordination off: there is no MCP config", placeholderMCPConfig)
		}
		usesFile = usesFile || strings.Contains(a, placeholderPromptFile)
	}
	r := strings.NewReplacer(placeholderPromptFile, PromptPath, placeholderMCPConfig, messages.ContainerMCPConfigPath, placeholderPrompt, prompt)
	for _, a := range p.Command {
		plan.Argv = append(plan.Argv, r.Replace(a))
	}
	plan.Argv = append(plan.Argv, p.Args...)
	if usesFile || p.PromptStdin {
		plan.Files = append(plan.Files, promptFile(prompt))
	}
	plan.Launch = p.PromptStdin
	return true, nil
}

func (commandBackend) parse(kind string, _ map[string]any, _ *Parser) (string, string) {
	return kind, ""
}

func (commandBackend) structured() bool { return false }

// validate requires a command: the command backend has no CLI of its own.
func (commandBackend) validate(a AgentConfig) error {
	if len(a.Command) == 0 {
		return errors.New("command is required for the command backend")
	}
	return nil
}
