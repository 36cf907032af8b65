package profile

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
)

// AgentConfig is the profile facet naming what runs in a run's container.
//
// The backend's plan (Profile.Plan) reads it for the run's argv, files and
// environment, the secrets stage for env_from_host; a warm container takes
// all of it from its run (warm.Late).
type AgentConfig struct {
	// Backend names the agent CLI and so how the command line, its MCP
	// configuration and its output are handled: command (default), claude,
	// codex, gemini, opencode, kimi or pi (see Backend* and
	// docs/backends.md).
	Backend string `toml:"backend" json:"backend"`
	// Command is the argv for the command backend: every "{prompt}" in an
	// element is replaced by the request's prompt and every
	// "{prompt_file}" by the path of a read-only file holding it. For the
	// agent backends it optionally replaces the CLI's executable (default:
	// its name, found on the image's PATH).
	Command []string `toml:"command" json:"command"`
	// Args are extra arguments appended to the CLI's argv.
	Args []string `toml:"args" json:"args,omitempty"`
	// PromptStdin (command backend) feeds the prompt on standard input.
	// Agent backends always do.
	PromptStdin bool `toml:"prompt_stdin" json:"prompt_stdin,omitempty"`
	// PermissionMode (claude) is Claude Code's permission mode; default
	// bypassPermissions (--dangerously-skip-permissions): the container is
	// the boundary. Others: default, acceptEdits, plan, dontAsk.
	PermissionMode string `toml:"permission_mode" json:"permission_mode,omitempty"`
	// ApprovalMode (gemini) is Gemini CLI's --approval-mode; default yolo.
	ApprovalMode string `toml:"approval_mode" json:"approval_mode,omitempty"`
	// Env holds fixed, non-secret environment variables.
	Env map[string]string `toml:"env" json:"env,omitempty"`
	// EnvFromHost names variables copied from the worker's own environment
	// (secrets such as API keys). Values are never logged nor recorded.
	EnvFromHost []string `toml:"env_from_host" json:"env_from_host,omitempty"`
}

// workerEnvPrefixes are the prefixes of the worker's own connection
// variables (NATS URL, credentials, nkeys and contexts; the Docker endpoint
// and its TLS material), compared without regard to case. A profile may not
// copy them into a run with env_from_host.
var workerEnvPrefixes = []string{"NATS_", "DOCKER_"}

// resolve applies the agent's default: the command backend.
func (a *AgentConfig) resolve() { a.Backend = cmp.Or(a.Backend, BackendCommand) }

// validate checks the agent: a registered backend, the keys only it reads,
// env's names (valid, not JETCREW_-prefixed) and env_from_host's (valid,
// none of the worker's own connection variables).
func (a AgentConfig) validate() error {
	b, err := lookupBackend(a.Backend)
	if err != nil {
		return err
	}
	if err := b.validate(a); err != nil {
		return err
	}
	for k := range a.Env {
		if !messages.ValidEnvName(k) {
			return fmt.Errorf("env name %q is not a valid variable name", k)
		}
		if strings.HasPrefix(strings.ToUpper(k), "JETCREW_") {
			return fmt.Errorf("env name %q is reserved (JETCREW_ prefix): jetcrew sets these", k)
		}
	}
	for _, k := range a.EnvFromHost {
		if !messages.ValidEnvName(k) {
			return fmt.Errorf("env_from_host name %q is not a valid variable name", k)
		}
		for _, pre := range workerEnvPrefixes {
			if strings.HasPrefix(strings.ToUpper(k), pre) {
				return fmt.Errorf("env_from_host %q is one of the worker's own connection variables (%s*): it never reaches a run", k, pre)
			}
		}
	}
	return nil
}

// promptInArgv reports whether the prompt becomes (part of) an argument:
// the command backend substituting "{prompt}" in its command (prompt_stdin
// or not). Agent backends feed it on stdin.
func (a AgentConfig) promptInArgv() bool {
	if a.Backend != BackendCommand {
		return false
	}
	for _, arg := range a.Command {
		if strings.Contains(arg, "{prompt}") {
			return true
		}
	}
	return false
}
