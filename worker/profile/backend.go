package profile

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
)

// backend is one agent CLI: how a run's argv, environment and files are
// planned, and how its structured stdout is read. Each lives in its own
// backend_<name>.go file and registers itself; adding a CLI is adding such a
// file (and its recorded output under testdata/agent-output).
type backend interface {
	// plan fills plan (MCPServers already set when coord is on) for
	// profile p and the run's prompt. exe is the CLI's argv[0...]: the
	// profile's command, else the CLI's default name. Agent backends get
	// the common tail (args, the prompt file, the launcher) from Profile.Plan;
	// a backend that returns done = true has set everything itself.
	plan(p Profile, prompt string, coord bool, exe func(def string) []string, plan *Plan) (done bool, err error)
	// parse reads one JSON line v of the CLI's stdout whose "type" is kind
	// into ps, and returns the agent event's kind and text. Not called for
	// a backend whose structured() is false.
	parse(kind string, v map[string]any, ps *Parser) (string, string)
	// structured reports whether the CLI's stdout is parsed at all.
	structured() bool
	// validate checks the profile keys only this backend reads
	// (permission_mode for claude, approval_mode for gemini, command for
	// the command backend), with defaults applied.
	validate(a AgentConfig) error
}

// registry maps a backend name (a profile's backend) to its backend.
var registry = map[string]backend{}

// registerBackend adds b under name; called from each backend file's init.
func registerBackend(name string, b backend) {
	if _, dup := registry[name]; dup {
		panic("worker: backend registered twice: " + name)
	}
	registry[name] = b
}

// lookupBackend returns the backend called name, or an error listing the
// registered ones.
func lookupBackend(name string) (backend, error) {
	if b, ok := registry[name]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("backend %q is not supported (supported: %s)", name, strings.Join(Backends(), ", "))
}

// Backends lists every registered backend name, sorted. docs/backends.md
// lists the same (a test checks it).
func Backends() []string {
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Paths inside the run container that backends use.
const (
	// PromptPath is the run's prompt, staged read-only; agent CLIs read it
	// on standard input (never as an argument, which the kernel bounds).
	PromptPath = messages.ContainerPromptPath
	// HomeSeedPath holds files the launcher copies into the writable HOME
	// before the agent starts.
	HomeSeedPath = messages.ContainerHomeSeedPath
	// LaunchPath is the bridge binary acting as the agent's launcher.
	LaunchPath = messages.ContainerBridgePath
	// LaunchEnvPath is the file of the variables the launcher sets at start
	// (Plan.EnvFile), staged read-only in the run's directory: a JSON array
	// of "KEY=VALUE" strings.
	LaunchEnvPath = messages.ContainerRunDir + "/launch-env.json"
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

// Plan is what a backend makes of a profile and a run: the argv, the
// environment, the files to stage, and what it cannot honour.
type Plan struct {
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
	// EnvFile has the launcher set the variables the worker stages at
	// LaunchEnvPath (the profile's env_from_host secrets) in the agent's
	// environment at start: bound late, never in the container's
	// configuration.
	EnvFile bool
	// SessionDir, for a backend whose CLI can resume a session, is the
	// container path of the directory holding the CLI's session files
	// (under HOME): `jetcrew workspace exec` keeps a copy of it for a
	// follow-up and restores an earlier run's there (docs/backends.md,
	// "Follow-ups"). Empty: the CLI cannot resume.
	SessionDir string
	// SessionKeep, when not empty, lists path.Match patterns of the names
	// directly in SessionDir that are kept, none other (Codex's sessions
	// and state database, not its credentials or configuration beside
	// them).
	SessionKeep []string
	// SessionSkip names entries directly in SessionDir that are never
	// kept: the CLI's credentials, logs, downloaded binaries.
	SessionSkip []string
	// SteerInput, when set, is the format in which the CLI takes user
	// turns on its standard input (messages.SteerInput*): the launcher
	// then keeps that input open for the operator's steers (`launch
	// --steer`), the prompt its first turn. Set by backends whose CLI
	// documents streamed input, when coordination is on.
	SteerInput string
}

// ContainerArgv returns the container command: Argv, through the launcher
// when the plan needs it.
func (p Plan) ContainerArgv() []string {
	if !p.Launch && !p.EgressRelay && !p.EnvFile {
		return p.Argv
	}
	argv := []string{LaunchPath, "launch"}
	if p.EnvFile {
		argv = append(argv, "--env-file", LaunchEnvPath)
	}
	if p.Launch {
		argv = append(argv, "--stdin", PromptPath)
		if p.SteerInput != "" {
			argv = append(argv, "--steer", p.SteerInput)
		}
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

// Plan returns the plan of a run of profile p with the given prompt.
// coord says whether the jetcrew MCP server is wired in. It returns an
// error (which retrying cannot fix) for an unknown backend or a prompt the
// backend cannot pass.
func (p Profile) Plan(prompt string, coord bool) (Plan, error) {
	// A profile with an egress allowlist reaches out only through the
	// relay the launcher starts (egress.go).
	plan := Plan{EgressRelay: p.HasEgress(), EnvFile: len(p.EnvFromHost) > 0}
	b, err := lookupBackend(p.Backend)
	if err != nil {
		return plan, err
	}
	if coord {
		plan.MCPServers = []string{messages.MCPServerName}
	}
	exe := func(def string) []string {
		if len(p.Command) > 0 {
			return append([]string(nil), p.Command...)
		}
		return []string{def}
	}
	setSessionDir(b, p, &plan)
	done, err := b.plan(p, prompt, coord, exe, &plan)
	if err != nil || done {
		return plan, err
	}
	plan.Argv = append(plan.Argv, p.Args...)
	plan.Files = append(plan.Files, promptFile(prompt))
	plan.Launch = true
	sort.SliceStable(plan.Files, func(i, j int) bool { return plan.Files[i].Path < plan.Files[j].Path })
	return plan, nil
}

// promptFile is the run's prompt staged read-only at PromptPath.
func promptFile(prompt string) StagedFile {
	return StagedFile{Path: PromptPath, Mode: 0o444, Data: []byte(prompt)}
}

// jsonFile stages v, marshalled, read-only at path.
func jsonFile(path string, v any) StagedFile {
	b, _ := json.Marshal(v) // maps of strings, bools and slices always marshal
	return StagedFile{Path: path, Mode: 0o444, Data: b}
}
