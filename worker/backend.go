package worker

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/jetcrew/jetcrew/coordination"
)

// Backend names: how a profile's agent CLI is run headless. Each follows the
// CLI's own documented flags; docs/backends.md lists them.
const (
	// BackendCommand runs the profile's Command with {prompt} (or
	// {prompt_file}) substituted; the MCP config path is in
	// JETCREW_MCP_CONFIG. The built-in shell profile uses it.
	BackendCommand = "command"
	// BackendClaude runs Claude Code: claude -p --output-format stream-json
	// --verbose --mcp-config <file> --strict-mcp-config.
	BackendClaude = "claude"
	// BackendCodex runs Codex CLI: codex exec --json with a writable
	// CODEX_HOME holding config.toml's [mcp_servers.jetcrew].
	BackendCodex = "codex"
	// BackendGemini runs Gemini CLI: gemini --output-format stream-json with
	// the MCP server in the system settings file it documents
	// (GEMINI_CLI_SYSTEM_SETTINGS_PATH).
	BackendGemini = "gemini"
	// BackendOpencode runs opencode: opencode run --format json with the
	// MCP entry in OPENCODE_CONFIG_CONTENT.
	BackendOpencode = "opencode"
	// BackendKimi runs Kimi CLI: kimi --print --output-format stream-json
	// --mcp-config-file <file>.
	BackendKimi = "kimi"
	// BackendPi runs pi: pi --print --mode json, MCP through the
	// pi-mcp-adapter configuration in ~/.pi/agent/mcp.json.
	BackendPi = "pi"
)

// Backends lists every backend name, sorted.
func Backends() []string {
	return []string{BackendClaude, BackendCodex, BackendCommand, BackendGemini, BackendKimi, BackendOpencode, BackendPi}
}

// Paths inside the run container that backends use.
const (
	// PromptPath is the run's prompt, staged read-only; agent CLIs read it
	// on standard input (never as an argument, which the kernel bounds).
	PromptPath = coordination.ContainerRunDir + "/prompt"
	// HomeSeedPath holds files the launcher copies into the writable HOME
	// before the agent starts.
	HomeSeedPath = coordination.ContainerRunDir + "/home"
	// LaunchPath is the bridge binary acting as the agent's launcher.
	LaunchPath = coordination.BridgePath
)

// maxArgPrompt is the longest prompt substituted into an argument, in bytes:
// well under the kernel's limit on one argument (MAX_ARG_STRLEN, 128 KiB).
const maxArgPrompt = 64 << 10

// StagedFile is a file the worker writes for a run.
type StagedFile struct {
	// Path is the file's path inside the container.
	Path string `json:"path"`
	// Mode is the file's permission bits as the agent sees them.
	Mode os.FileMode `json:"mode"`
	// Data is the content; never in receipts.
	Data []byte `json:"-"`
}

// AgentPlan is what a backend makes of a profile and a run: the argv, the
// environment, the files to stage, and what it cannot honour.
type AgentPlan struct {
	// Argv is the process argv (after the launcher, when Launch is set).
	Argv []string
	// Env holds KEY=VALUE entries (non-secret) the backend adds.
	Env []string
	// Files are staged read-only under /run/jetcrew; those under
	// HomeSeedPath are copied into HOME, writable, by the launcher.
	Files []StagedFile
	// Launch runs Argv through the launcher (seeding HOME, the prompt on
	// stdin).
	Launch bool
	// MCPServers names the MCP servers configured for the agent.
	MCPServers []string
	// Unsupported lists what the CLI cannot honour, for the receipt.
	Unsupported []string
	// EgressRelay starts the egress relay through the launcher (a profile
	// with an egress allowlist).
	EgressRelay bool
	// InitCheck is true when the CLI reports its MCP servers' status in its
	// output (Claude Code's init event), which then proves the bridge.
	InitCheck bool
}

// containerArgv returns the container command: Argv, through the launcher
// when the plan needs it.
func (p AgentPlan) containerArgv() []string {
	if !p.Launch && !p.EgressRelay {
		return p.Argv
	}
	argv := []string{LaunchPath, "launch"}
	if p.Launch {
		argv = append(argv, "--stdin", PromptPath)
	}
	if p.EgressRelay {
		argv = append(argv, "--egress-relay", EgressProxyAddr+"="+EgressSocketPath)
	}
	for _, f := range p.Files {
		if strings.HasPrefix(f.Path, HomeSeedPath+"/") {
			argv = append(argv, "--home-seed", HomeSeedPath)
			break
		}
	}
	return append(append(argv, "--"), p.Argv...)
}

// planAgent returns the plan of profile p for a run with the given prompt
// and home directory. coord says whether the jetcrew MCP server is wired in.
// It returns an error (which retrying cannot fix) for a prompt the backend
// cannot pass.
func planAgent(p Profile, prompt string, coord bool) (AgentPlan, error) {
	exe := func(def string) []string {
		if len(p.Command) > 0 {
			return append([]string(nil), p.Command...)
		}
		return []string{def}
	}
	var plan AgentPlan
	promptFile := StagedFile{Path: PromptPath, Mode: 0o444, Data: []byte(prompt)}
	if coord {
		plan.MCPServers = []string{coordination.MCPServerName}
	}
	switch p.Backend {
	case BackendCommand:
		usesFile := false
		for _, a := range p.Command {
			if strings.Contains(a, "{prompt}") && len(prompt) > maxArgPrompt {
				return plan, fmt.Errorf("prompt is %d bytes, more than %d, too long to pass as an argument; give the profile {prompt_file} or prompt_stdin = true", len(prompt), maxArgPrompt)
			}
			usesFile = usesFile || strings.Contains(a, "{prompt_file}")
		}
		for _, a := range p.Command {
			a = strings.ReplaceAll(a, "{prompt_file}", PromptPath)
			plan.Argv = append(plan.Argv, strings.ReplaceAll(a, "{prompt}", prompt))
		}
		plan.Argv = append(plan.Argv, p.Args...)
		if usesFile || p.PromptStdin {
			plan.Files = append(plan.Files, promptFile)
		}
		plan.Launch = p.PromptStdin
		return plan, nil

	case BackendClaude:
		plan.Argv = append(exe("claude"), "-p", "--output-format", "stream-json", "--verbose")
		if coord {
			plan.Argv = append(plan.Argv, "--mcp-config", coordination.ContainerMCPConfigPath, "--strict-mcp-config")
			plan.InitCheck = true
		} else {
			// An empty config with --strict-mcp-config: no MCP server at
			// all, not whatever the image's user settings list.
			plan.Files = append(plan.Files, StagedFile{Path: coordination.ContainerRunDir + "/mcp-none.json", Mode: 0o444, Data: []byte(`{"mcpServers":{}}`)})
			plan.Argv = append(plan.Argv, "--mcp-config", coordination.ContainerRunDir+"/mcp-none.json", "--strict-mcp-config")
		}
		switch p.PermissionMode {
		case "", "bypassPermissions":
			plan.Argv = append(plan.Argv, "--dangerously-skip-permissions")
		default:
			plan.Argv = append(plan.Argv, "--permission-mode", p.PermissionMode)
		}

	case BackendCodex:
		plan.Argv = append(exe("codex"), "exec", "--json", "--skip-git-repo-check")
		var toml strings.Builder
		if coord {
			fmt.Fprintf(&toml, "[mcp_servers.%s]\ncommand = %q\nargs = []\nstartup_timeout_sec = 30\ntool_timeout_sec = 60\n",
				coordination.MCPServerName, coordination.BridgePath)
		}
		plan.Files = append(plan.Files, StagedFile{Path: HomeSeedPath + "/.codex/config.toml", Mode: 0o444, Data: []byte(toml.String())})
		plan.Env = append(plan.Env, "CODEX_HOME="+p.Home+"/.codex")
		// "-": codex exec reads the prompt from standard input.
		plan.Argv = append(plan.Argv, "-")

	case BackendGemini:
		settings := map[string]any{"security": map[string]any{"folderTrust": map[string]any{"enabled": false}}}
		if coord {
			settings["mcpServers"] = map[string]any{coordination.MCPServerName: map[string]any{"command": coordination.BridgePath, "trust": true}}
		} else {
			settings["mcpServers"] = map[string]any{}
		}
		b, _ := json.Marshal(settings)
		// /run/jetcrew is 0755 and read-only: Gemini CLI skips a settings
		// file under a group- or world-writable directory.
		path := coordination.ContainerRunDir + "/gemini-settings.json"
		plan.Files = append(plan.Files, StagedFile{Path: path, Mode: 0o444, Data: b})
		plan.Env = append(plan.Env, "GEMINI_CLI_SYSTEM_SETTINGS_PATH="+path)
		mode := p.ApprovalMode
		if mode == "" {
			mode = "yolo"
		}
		plan.Argv = append(exe("gemini"), "--output-format", "stream-json", "--approval-mode", mode)

	case BackendOpencode:
		cfg := map[string]any{"mcp": map[string]any{}}
		if coord {
			cfg["mcp"] = map[string]any{coordination.MCPServerName: map[string]any{"type": "local", "command": []string{coordination.BridgePath}, "enabled": true}}
		}
		b, _ := json.Marshal(cfg)
		plan.Env = append(plan.Env, "OPENCODE_CONFIG_CONTENT="+string(b))
		plan.Argv = append(exe("opencode"), "run", "--format", "json")

	case BackendKimi:
		plan.Argv = append(exe("kimi"), "--print", "--output-format", "stream-json")
		if coord {
			plan.Argv = append(plan.Argv, "--mcp-config-file", coordination.ContainerMCPConfigPath)
		}

	case BackendPi:
		plan.Argv = append(exe("pi"), "--print", "--mode", "json")
		cfg := map[string]any{"mcpServers": map[string]any{}}
		if coord {
			cfg["mcpServers"] = map[string]any{coordination.MCPServerName: map[string]any{"command": coordination.BridgePath, "args": []string{}}}
		}
		b, _ := json.Marshal(cfg)
		plan.Files = append(plan.Files, StagedFile{Path: HomeSeedPath + "/.pi/agent/mcp.json", Mode: 0o444, Data: b})
		plan.Unsupported = append(plan.Unsupported, "pi has no built-in MCP client: the image must include the pi-mcp-adapter extension, which reads ~/.pi/agent/mcp.json")

	default:
		return plan, fmt.Errorf("backend %q is not supported (supported: %s)", p.Backend, strings.Join(Backends(), ", "))
	}
	plan.Argv = append(plan.Argv, p.Args...)
	plan.Files = append(plan.Files, promptFile)
	plan.Launch = true
	sort.SliceStable(plan.Files, func(i, j int) bool { return plan.Files[i].Path < plan.Files[j].Path })
	return plan, nil
}

// ProfileDescription is a profile's effective configuration as `jetcrew
// profiles check` prints it: every setting with its default applied, and
// what its backend would run (the prompt shown as "<prompt>").
type ProfileDescription struct {
	Profile
	// StallTimeoutEffective and BridgeDeadlineEffective are the watchdog
	// bounds in force ("0s": off).
	StallTimeoutEffective   string `json:"stall_timeout_effective"`
	BridgeDeadlineEffective string `json:"bridge_deadline_effective"`
	// Argv is the container command for a run.
	Argv []string `json:"argv"`
	// Env are the variables the backend adds (names and fixed values).
	Env []string `json:"backend_env,omitempty"`
	// Files are the files the backend stages, with their modes.
	Files []string `json:"files,omitempty"`
	// MCPServers names the MCP servers the agent is given.
	MCPServers []string `json:"mcp_servers,omitempty"`
	// Unsupported lists what the CLI cannot honour.
	Unsupported []string `json:"unsupported,omitempty"`
}

// Describe returns p's effective configuration, or the error a run of it
// would fail with.
func (p Profile) Describe() (ProfileDescription, error) {
	plan, err := planAgent(p, "<prompt>", p.CoordinationOn())
	if err != nil {
		return ProfileDescription{}, err
	}
	d := ProfileDescription{Profile: p, Argv: plan.containerArgv(), Env: plan.Env, MCPServers: plan.MCPServers,
		Unsupported: plan.Unsupported, StallTimeoutEffective: p.stallTimeout.String(), BridgeDeadlineEffective: p.bridgeDeadline.String()}
	for _, f := range plan.Files {
		d.Files = append(d.Files, fmt.Sprintf("%s (%04o)", f.Path, f.Mode.Perm()))
	}
	return d, nil
}
