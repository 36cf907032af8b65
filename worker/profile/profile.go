package profile

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jetcrew/jetcrew/egress/policy"
)

// Profile is an operator-defined recipe for running a request: the image,
// the command, the user, the limits and the network. A run request only
// names a profile; it can never choose any of these.
//
// Profiles are read from a TOML file (see LoadProfiles), one table per
// profile under [profiles.<name>]; docs/profiles.md documents each key.
type Profile struct {
	// Name is the profile's name (the TOML table key).
	Name string `toml:"-" json:"name"`
	// Backend names the agent CLI and so how the command line, its MCP
	// configuration and its output are handled: command (default), claude,
	// codex, gemini, opencode, kimi or pi (see Backend* and
	// docs/backends.md).
	Backend string `toml:"backend" json:"backend"`
	// Image is the image reference. It must exist on the worker's Docker
	// engine; it is never pulled.
	Image string `toml:"image" json:"image"`
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
	// StallTimeout stops a run that shows no progress (no output, no
	// coordination traffic) for this long, ending it "stalled"; a Go
	// duration string. Default: 10m for agent backends, off for command.
	StallTimeout string `toml:"stall_timeout" json:"stall_timeout,omitempty"`
	// BridgeDeadline is how long a run's process (any backend, command
	// included) has to start the jetcrew MCP server (proved by the bridge's
	// first connection, or by Claude Code's init event) before the run is
	// stopped and ends failed; default 2m. A process that exits on its own
	// before that proof fails its run too, whatever its exit code. Both
	// apply while coordination is on and RequireBridge is not false.
	BridgeDeadline string `toml:"bridge_deadline" json:"bridge_deadline,omitempty"`
	// RequireBridge, when false, lets a run with coordination on go without
	// ever reaching its bridge: no bridge deadline, no failure for exiting
	// before it, and a run whose bridge never connected records
	// coordination "unused" in its state and its finished event. Default
	// true; the built-in shell profile sets false (/bin/sh is not an MCP
	// client), and so must any command profile whose process is not one.
	RequireBridge *bool `toml:"require_bridge" json:"require_bridge,omitempty"`
	// User is "uid:gid", numeric and never 0. Default "65532:65532".
	User string `toml:"user" json:"user"`
	// Home is the writable home directory in the container (a tmpfs owned
	// by User). Default "/home/agent".
	Home string `toml:"home" json:"home"`
	// WorkDir is the working directory. Default: Home.
	WorkDir string `toml:"workdir" json:"workdir"`
	// Network is "none" (default), "bridge" or the name of a Docker network
	// the operator created. A profile with Egress keeps "none": its only way
	// out is its egress proxy.
	Network string `toml:"network" json:"network"`
	// Egress lists what the profile's runs may reach, as "name:port"
	// ("*.example.com:443" for any name under example.com, "10.0.0.0/8:443"
	// or an address to list private addresses explicitly). Runs then have
	// no network but loopback, and their HTTP clients reach only these
	// through the worker's egress proxy (docs/profiles.md, docs/jail.md).
	Egress []string `toml:"egress" json:"egress,omitempty"`
	// EgressInject names secrets the egress proxy adds, as a header, to the
	// requests to one allowed host, instead of passing them into the
	// container (see EgressInject).
	EgressInject []EgressInject `toml:"egress_inject" json:"egress_inject,omitempty"`
	// EgressUnmeteredPaths lists the requests on egress_inject hosts that
	// pass without usage while the run has a cost or token budget, which
	// otherwise refuses every request whose usage the proxy cannot read
	// (another path, a background Responses request, a WebSocket
	// upgrade): "[METHOD ]PATH", PATH exact or ending "/*"
	// (policy.ParseUnmeteredPaths). The run's receipt names them. Empty
	// (default): none. Needs egress_inject.
	EgressUnmeteredPaths []string `toml:"egress_unmetered_paths" json:"egress_unmetered_paths,omitempty"`
	egressUnmetered      policy.UnmeteredPaths
	// EgressRate paces the runs' requests to each egress_inject host by
	// its key, across every worker using the key (EgressRate). Nil:
	// none. Needs egress_inject.
	EgressRate *EgressRate `toml:"egress_rate" json:"egress_rate,omitempty"`
	// EgressAsk lists hosts ("name:port", "*.suffix:port"; no addresses)
	// a run may reach only once an operator allows it, live: a connection
	// to one is held until an operator allows or denies it, for the run
	// or for the profile from now on (jetcrew egress pending|allow|deny),
	// or EgressAskTimeout passes (then it is refused). Empty: none.
	EgressAsk []string `toml:"egress_ask" json:"egress_ask,omitempty"`
	// EgressAskTimeout is how long a connection to an egress_ask host
	// waits for an operator, a Go duration; default DefaultEgressAskTimeout.
	EgressAskTimeout string `toml:"egress_ask_timeout" json:"egress_ask_timeout,omitempty"`
	egressAsk        policy.Policy
	egressAskTimeout time.Duration
	// Runtime is the OCI runtime, any name the engine reports (`docker
	// info` Runtimes): runc (the engine's default when empty), runsc
	// (gVisor), crun, kata, sysbox-runc, ... The worker refuses to start
	// when the engine lacks a profile's runtime (docs/jail.md).
	Runtime string `toml:"runtime" json:"runtime"`
	// MemoryMiB is the memory limit in MiB (no swap). Default 512.
	MemoryMiB int64 `toml:"memory_mib" json:"memory_mib"`
	// CPUs is the CPU limit in CPUs (1.5 = one and a half). Default 1.
	CPUs float64 `toml:"cpus" json:"cpus"`
	// Pids is the process and thread limit. Default 256.
	Pids int64 `toml:"pids" json:"pids"`
	// TmpMiB is the size of the tmpfs at /tmp, in MiB. Default 64.
	TmpMiB int64 `toml:"tmp_mib" json:"tmp_mib"`
	// HomeMiB is the size of the tmpfs at Home, in MiB. Default 64.
	HomeMiB int64 `toml:"home_mib" json:"home_mib"`
	// WorkspaceMiB is the size, in MiB, of the workspace of a run (a
	// request with a workspace): a tmpfs volume of the engine's, so the
	// kernel bounds what the run can write there (ENOSPC), and its pages
	// count against the run's memory limit, as /tmp's and home's do.
	// Default half of what MemoryMiB leaves beside TmpMiB and HomeMiB (192
	// for the defaults), at least 1; a value set must leave room beside
	// them (checkWorkspaceMiB). See docs/workspaces.md.
	WorkspaceMiB int64 `toml:"workspace_mib" json:"workspace_mib,omitempty"`
	// GitRemotes lists the git remotes a request's workspace may name
	// instead of a snapshot: each an http(s) URL, exact or ending in "*"
	// after a '/' (any path below). Empty (default): git sources are
	// refused. See validateGitRemotes and docs/workspaces.md.
	GitRemotes []string `toml:"git_remotes" json:"git_remotes,omitempty"`
	// FromProfiles names the profiles whose runs a run of this profile may
	// start from (a request's workspace.from, docs/workspaces.md, "Start
	// from a result"): profile names, or "*" for any. Absent (nil): this
	// profile alone, so no run's result feeds another profile unless that
	// profile says so. Empty ([]): requests with workspace.from are
	// refused.
	FromProfiles *[]string `toml:"from_profiles" json:"from_profiles,omitempty"`
	// Feeds names the profiles whose runs may start from a run of this
	// profile: profile names, or "*" for any. Absent (nil): any profile
	// whose from_profiles accepts this one. Empty ([]): no run starts from
	// this profile's runs.
	Feeds *[]string `toml:"feeds" json:"feeds,omitempty"`
	// Timeout is the default run timeout, a Go duration string. Empty means
	// the worker's default.
	Timeout string `toml:"timeout" json:"timeout,omitempty"`
	// Env holds fixed, non-secret environment variables.
	Env map[string]string `toml:"env" json:"env,omitempty"`
	// Retries is how many times a run whose process exits non-zero (not
	// OOM-killed, not stopped by a watchdog) is tried again, with backoff,
	// before it ends failed; bounded by the consumer's max deliver. Default
	// 0: an agent's failure is final.
	Retries int `toml:"retries" json:"retries,omitempty"`
	// MaxCostUSD is the run's model budget in US dollars, by the worker's
	// price table (--prices), enforced by its egress proxy on the hosts of
	// egress_inject: the first model request after the run's priced usage
	// reached it is answered with the provider's quota error and the run
	// ends failed (egress.Limits; the overshoot bound is documented
	// there). 0 (default): none. Needs egress_inject.
	MaxCostUSD float64 `toml:"max_cost_usd" json:"max_cost_usd,omitempty"`
	// MaxOutputTokens is the run's budget of output tokens, as the model
	// API reported them (as MaxCostUSD). 0 (default): none.
	MaxOutputTokens int64 `toml:"max_output_tokens" json:"max_output_tokens,omitempty"`
	// MaxModelRequests is the most model requests the run may send (as
	// MaxCostUSD; counted when sent, so never overshot). 0 (default):
	// none.
	MaxModelRequests int64 `toml:"max_model_requests" json:"max_model_requests,omitempty"`
	// GroupBudget is the budget every run of a group shares (the
	// request's group, else its id), on any worker, over a window;
	// PoolBudget the one every run of the pool shares. Kept in the
	// jetcrew-budgets key-value bucket. Nil: none. Needs egress_inject.
	GroupBudget *SharedBudget `toml:"group_budget" json:"group_budget,omitempty"`
	PoolBudget  *SharedBudget `toml:"pool_budget" json:"pool_budget,omitempty"`
	// OnBudget is what happens to a run's model request past a budget:
	// "fail" (or "", the default) answers it with the provider's quota error and ends
	// the run failed; "pause" holds it (and the run's later ones) until an
	// operator raises the budget (jetcrew budget) or BudgetPause passes,
	// then fails as "fail" does.
	OnBudget string `toml:"on_budget" json:"on_budget,omitempty"`
	// BudgetPause is how long "pause" holds a request, a Go duration;
	// default DefaultBudgetPause.
	BudgetPause string `toml:"budget_pause" json:"budget_pause,omitempty"`
	budgetPause time.Duration

	// Warm is how many warm containers of this profile each worker keeps
	// started and waiting for a run (worker/warm): a run that finds one
	// ready starts in milliseconds instead of a container start. Bounded
	// by the worker's --warm-max over all profiles; 0 (default) keeps
	// none. It needs coordination on: a warm container waits in the
	// jetcrew launcher the bridge stage mounts.
	Warm int `toml:"warm" json:"warm,omitempty"`
	// WarmWorkspace is how many warm containers of this profile each
	// worker keeps for runs with a workspace: each made as a workspace
	// run's container is, with its own empty tmpfs volume of
	// workspace_mib at /workspace, the staged in-jail tool and empty
	// snapshot and gate directories; the run's snapshot is linked in and
	// unpacked by its launcher once claimed (docs/workspaces.md). A run
	// with a workspace never takes one of Warm's containers, nor a run
	// without one of these (their jails differ). Bounded with Warm by
	// --warm-max; 0 (default) keeps none. It needs coordination on.
	WarmWorkspace int `toml:"warm_workspace" json:"warm_workspace,omitempty"`
	// Coordination turns the run's MCP coordination bridge on (default) or
	// off. When on and the bridge cannot be staged, runs are refused.
	Coordination *bool `toml:"coordination" json:"coordination"`
	// MaxOutputMiB is the run's output budget: the most bytes of stdout and
	// stderr together, in MiB, published as output events. Past it the run
	// goes on and its output is counted (RunState.OutputDroppedBytes) and
	// dropped. Default DefaultMaxOutputMiB (64); -1 means unlimited.
	MaxOutputMiB int64 `toml:"max_output_mib" json:"max_output_mib"`
	// EnvFromHost names variables copied from the worker's own environment
	// (secrets such as API keys). Values are never logged nor recorded.
	EnvFromHost []string `toml:"env_from_host" json:"env_from_host,omitempty"`
	// SignedBy lists NKey user public keys ("U…"); when set, a request for
	// the profile runs only when signed by one of them (Jetcrew-Signer and
	// Jetcrew-Signature headers, see messages.HeaderSignature); otherwise it
	// fails with the reason and a dead letter, before anything runs.
	SignedBy []string `toml:"signed_by" json:"signed_by,omitempty"`
	// RequestEnv names the variables a run request's env may set for this
	// profile: exact names, or prefixes ending in '*' ("APP_*"; "*" alone
	// accepts any name). Default: empty, a request carrying env is refused.
	// Loader, runtime, proxy and worker variables (DeniedRequestEnv) are
	// refused even when listed. The built-in shell profile has ["*"].
	RequestEnv []string `toml:"request_env" json:"request_env,omitempty"`

	timeout        time.Duration
	egressPolicy   policy.Policy
	stallTimeout   time.Duration
	bridgeDeadline time.Duration
}

// EgressInject is a header the egress proxy sets on every HTTPS request of
// a run to one host, its value read from the worker's environment: the key
// never enters the container. The proxy terminates TLS for that host with
// the installation's egress CA, which the container trusts.
type EgressInject struct {
	// Host is "name:port", one of the profile's Egress entries (not a
	// wildcard).
	Host string `toml:"host" json:"host"`
	// Header is the header's name, for example "x-api-key" or
	// "Authorization". A header of that name from the agent is replaced.
	Header string `toml:"header" json:"header"`
	// FromEnv names the worker's environment variable holding the value.
	FromEnv string `toml:"from_env" json:"from_env"`
	// Prefix is put before the value, for example "Bearer ".
	Prefix string `toml:"prefix" json:"prefix,omitempty"`
}

// Profile defaults.
const (
	DefaultUser      = "65532:65532"
	DefaultHome      = "/home/agent"
	DefaultMemoryMiB = 512
	DefaultCPUs      = 1.0
	DefaultPids      = 256
	DefaultTmpMiB    = 64
	DefaultHomeMiB   = 64
	// SandboxImage is the image of the built-in shell profile, built by
	// `make images` from Debian's busybox-static.
	SandboxImage = "jetcrew-sandbox:latest"
)

// ShellProfile returns the built-in "shell" profile: /bin/sh -c <prompt> in
// SandboxImage, network none, default limits.
func ShellProfile() Profile {
	p := Profile{
		Name:    "shell",
		Backend: "command",
		Image:   SandboxImage,
		Command: []string{"/bin/sh", "-c", "{prompt}"},
		// Any variable but the denied ones: the script can set them itself.
		RequestEnv: []string{"*"},
		// A shell script is not an MCP client: it may use the bridge, but
		// need not.
		RequireBridge: new(bool),
	}
	p, _ = p.Resolve()
	return p
}

// Resolve returns p with every default applied and its durations and
// egress policy parsed, then validated: the value runs read, never
// defaulted again. ParseProfiles resolves every profile it loads; a
// Profile built in code must be resolved before a worker uses it. The
// error names the key at fault.
func (p Profile) Resolve() (Profile, error) {
	p, err := p.withDefaults()
	if err != nil {
		return p, err
	}
	return p, p.validate()
}

// withDefaults applies the defaults and parses the durations and the
// egress policy; Resolve validates the result.
func (p Profile) withDefaults() (Profile, error) {
	p.Backend, p.User, p.Home, p.Network = cmp.Or(p.Backend, "command"), cmp.Or(p.User, DefaultUser), cmp.Or(p.Home, DefaultHome), cmp.Or(p.Network, "none")
	p.WorkDir = cmp.Or(p.WorkDir, p.Home)
	p.MemoryMiB, p.CPUs, p.Pids = cmp.Or(p.MemoryMiB, DefaultMemoryMiB), cmp.Or(p.CPUs, DefaultCPUs), cmp.Or(p.Pids, DefaultPids)
	p.TmpMiB, p.HomeMiB = cmp.Or(p.TmpMiB, DefaultTmpMiB), cmp.Or(p.HomeMiB, DefaultHomeMiB)
	if p.WorkspaceMiB == 0 {
		p.WorkspaceMiB = defaultWorkspaceMiB(p)
	} else if err := p.checkWorkspaceMiB(); err != nil {
		return p, err
	}
	p.MaxOutputMiB = cmp.Or(p.MaxOutputMiB, DefaultMaxOutputMiB)
	if p.Coordination == nil {
		on := true
		p.Coordination = &on
	}
	if err := p.parseEgress(); err != nil {
		return p, err
	}
	if err := p.parseDurations(); err != nil {
		return p, err
	}
	return p, nil
}

// parseEgress parses the egress and egress_ask allowlists into their
// policies (policy.Parse); egress_ask names hosts only.
func (p *Profile) parseEgress() error {
	if len(p.Egress) > 0 {
		pol, err := policy.Parse(p.Egress)
		if err != nil {
			return err
		}
		p.egressPolicy = pol
	}
	if len(p.EgressAsk) > 0 {
		pol, err := policy.Parse(p.EgressAsk)
		if err != nil {
			return fmt.Errorf("egress_ask: %w", err)
		}
		for _, r := range pol.Rules() {
			if r.Name == "" {
				return fmt.Errorf("egress_ask entry %s: an operator allows names, not addresses", r)
			}
		}
		p.egressAsk = pol
	}
	if len(p.EgressUnmeteredPaths) > 0 {
		if len(p.EgressInject) == 0 {
			return errors.New("egress_unmetered_paths needs egress_inject: it lists requests on the hosts the proxy meters")
		}
		u, err := policy.ParseUnmeteredPaths(p.EgressUnmeteredPaths)
		if err != nil {
			return err
		}
		p.egressUnmetered = u
	}
	return nil
}

// parseDurations parses the profile's durations (timeout, stall_timeout,
// bridge_deadline, budget_pause, egress_ask_timeout, budget windows) with
// their defaults.
func (p *Profile) parseDurations() error {
	stallDefault := 10 * time.Minute
	if p.Backend == BackendCommand {
		stallDefault = 0
	}
	for _, d := range []struct {
		name string
		s    string
		dst  *time.Duration
		def  time.Duration
	}{
		{"timeout", p.Timeout, &p.timeout, 0},
		{"stall_timeout", p.StallTimeout, &p.stallTimeout, stallDefault},
		{"bridge_deadline", p.BridgeDeadline, &p.bridgeDeadline, 2 * time.Minute},
		{"budget_pause", p.BudgetPause, &p.budgetPause, DefaultBudgetPause},
		{"egress_ask_timeout", p.EgressAskTimeout, &p.egressAskTimeout, DefaultEgressAskTimeout},
	} {
		*d.dst = d.def
		if d.s != "" {
			v, err := time.ParseDuration(d.s)
			if err != nil {
				return fmt.Errorf("%s: %w", d.name, err)
			}
			*d.dst = v
		}
	}
	for _, sb := range []**SharedBudget{&p.GroupBudget, &p.PoolBudget} {
		if *sb == nil {
			continue
		}
		b := **sb // a copy: the parsed profile's stays as written
		b.window = 24 * time.Hour
		if b.Window != "" {
			v, err := time.ParseDuration(b.Window)
			if err != nil {
				return fmt.Errorf("budget window: %w", err)
			}
			b.window = v
		}
		*sb = &b
	}
	return nil
}

// What on_budget may say.
const (
	// OnBudgetFail refuses a request past a budget and ends the run.
	OnBudgetFail = "fail"
	// OnBudgetPause holds it until the budget is raised.
	OnBudgetPause = "pause"
)

// CoordinationOn reports whether runs of the profile get the coordination
// bridge.
func (p Profile) CoordinationOn() bool { return p.Coordination == nil || *p.Coordination }

// BridgeRequired reports whether a run of p must reach its bridge within
// BridgeDeadlineDuration: coordination on and RequireBridge not false.
func (p Profile) BridgeRequired() bool {
	return p.CoordinationOn() && (p.RequireBridge == nil || *p.RequireBridge)
}

// TimeoutDuration is the profile's run timeout (the timeout key parsed);
// 0 means the worker's default.
func (p Profile) TimeoutDuration() time.Duration { return p.timeout }

// StallTimeoutDuration is the stall watchdog's bound (the stall_timeout
// key, or its backend's default: 10 minutes for agent CLIs, off for the
// command backend); 0 means off.
func (p Profile) StallTimeoutDuration() time.Duration { return p.stallTimeout }

// BridgeDeadlineDuration is how long a run has to start the jetcrew MCP
// server when BridgeRequired (the bridge_deadline key; default 2 minutes).
func (p Profile) BridgeDeadlineDuration() time.Duration { return p.bridgeDeadline }

// EgressPolicy is the parsed egress allowlist (the egress key); the zero
// Policy for a profile without one.
func (p Profile) EgressPolicy() policy.Policy { return p.egressPolicy }

// HasEgress reports whether the profile has an egress allowlist: its runs
// have network none and reach only those hosts, through their egress
// proxy.
func (p Profile) HasEgress() bool { return len(p.Egress) > 0 || len(p.EgressAsk) > 0 }

// EgressUnmetered returns egress_unmetered_paths, parsed.
func (p Profile) EgressUnmetered() policy.UnmeteredPaths { return p.egressUnmetered }

// EgressAskPolicy returns the hosts of egress_ask, parsed.
func (p Profile) EgressAskPolicy() policy.Policy { return p.egressAsk }

// EgressAskTimeoutDuration returns how long a connection to an egress_ask
// host waits for an operator.
func (p Profile) EgressAskTimeoutDuration() time.Duration { return p.egressAskTimeout }

// DefaultEgressAskTimeout is how long a connection to an egress_ask host
// waits for an operator by default.
const DefaultEgressAskTimeout = 2 * time.Minute

// Owner returns the numeric uid and gid of the profile's user (the user
// key, validated when the profile was resolved).
func (p Profile) Owner() (uid, gid int) {
	uid, gid, _ = parseUser(p.User)
	return uid, gid
}

// Digest returns the hex SHA-256 of p's effective configuration (its JSON
// encoding, every default applied): a receipt's ProfileDigest. It costs a
// JSON encoding; the worker computes it once per profile.
func (p Profile) Digest() string {
	effective, _ := json.Marshal(p) // a Profile always marshals
	sum := sha256.Sum256(effective)
	return hex.EncodeToString(sum[:])
}

// Profiles is a validated set of profiles by name.
type Profiles map[string]Profile

// DefaultProfiles returns the built-in set: just ShellProfile.
func DefaultProfiles() Profiles {
	return Profiles{"shell": ShellProfile()}
}

// Names returns the profile names, sorted.
func (ps Profiles) Names() []string {
	names := make([]string, 0, len(ps))
	for n := range ps {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// SharedBudget is a budget runs share (Profile.GroupBudget, PoolBudget):
// what they may spend together within each window. Zero fields are no
// limit.
type SharedBudget struct {
	// MaxCostUSD is in US dollars by the worker's price table.
	MaxCostUSD float64 `toml:"max_cost_usd" json:"max_cost_usd,omitempty"`
	// MaxOutputTokens counts output tokens.
	MaxOutputTokens int64 `toml:"max_output_tokens" json:"max_output_tokens,omitempty"`
	// MaxModelRequests counts model requests.
	MaxModelRequests int64 `toml:"max_model_requests" json:"max_model_requests,omitempty"`
	// Window is how long a budget lasts before it starts again, a Go
	// duration from 1m to 168h (messages.MaxBudgetWindow); windows are
	// aligned to the Unix epoch. Default "24h".
	Window string `toml:"window" json:"window,omitempty"`
	window time.Duration
}

// WindowDuration returns the budget's window.
func (b *SharedBudget) WindowDuration() time.Duration { return b.window }

// DefaultBudgetPause is how long on_budget = "pause" holds a request by
// default.
const DefaultBudgetPause = 15 * time.Minute

// BudgetPauseDuration returns how long on_budget = "pause" holds a
// request.
func (p Profile) BudgetPauseDuration() time.Duration { return p.budgetPause }
