package messages

// Receipt describes the effective configuration a run used, from the
// worker's profile: what ran, as whom, with which limits, mounts, MCP servers
// and files. It never holds file contents or environment values, only names
// and modes. It is attached to the run's state (RunState.Receipt), to its
// finished event and to its dead letter (header HeaderReceipt), on success
// and on every failure, including one before the agent started.
type Receipt struct {
	// Profile is the profile's name; ProfileDigest the SHA-256 of its
	// effective configuration (hex), so two runs can be compared.
	Profile       string `json:"profile"`
	ProfileDigest string `json:"profile_digest"`
	// Backend is the agent CLI backend.
	Backend string `json:"backend"`
	// Image is the image reference; ImageID the engine's id for it, when
	// the container was created.
	Image   string `json:"image"`
	ImageID string `json:"image_id,omitempty"`
	// Warm is true when the run started in a warm container: one made
	// before the run with this receipt's jail (the worker checks that it
	// is the one a new container would have), handed the run's command,
	// environment and working directory at its start.
	Warm bool `json:"warm,omitempty"`
	// User is the container's uid:gid.
	User string `json:"user"`
	// Runtime is the OCI runtime ("" = the engine's default, runc).
	Runtime string `json:"runtime,omitempty"`
	// Network is the container's network mode.
	Network string `json:"network"`
	// Egress is the profile's egress allowlist, when it has one.
	Egress []string `json:"egress,omitempty"`
	// Prices is "sha256:<hex>" of the price table the run's model usage
	// was priced by (the worker's --prices file), when the run is metered
	// and the worker has one.
	Prices string `json:"prices,omitempty"`
	// Budgets are the run's model budgets (profile keys max_cost_usd,
	// max_output_tokens, max_model_requests), when it has any.
	Budgets *ReceiptBudgets `json:"budgets,omitempty"`
	// EgressUnmeteredPaths are the requests on metered hosts the profile
	// lets pass without usage under a cost or token budget (profile key
	// egress_unmetered_paths), when it lists any.
	EgressUnmeteredPaths []string `json:"egress_unmetered_paths,omitempty"`
	// Limits are the resource limits.
	Limits ReceiptLimits `json:"limits"`
	// Argv is the container command with the prompt replaced by
	// "<prompt>".
	Argv []string `json:"argv,omitempty"`
	// BridgeDigest is "sha256:<hex>" of the bridge binary the run mounted
	// (the worker's content-addressed copy), when it mounted one.
	BridgeDigest string `json:"bridge_digest,omitempty"`
	// Mounts are the bind mounts (container path, host source, read-only).
	Mounts []ReceiptMount `json:"mounts"`
	// Tmpfs are the tmpfs mounts: container path and options.
	Tmpfs map[string]string `json:"tmpfs,omitempty"`
	// MCPServers names the MCP servers configured for the agent.
	MCPServers []string `json:"mcp_servers"`
	// Files are the files written for the run: container path and mode.
	Files []ReceiptFile `json:"files"`
	// EnvNames are the names (never the values) of the environment
	// variables set, secrets from the worker's environment included.
	EnvNames []string `json:"env_names"`
	// Timeout, StallTimeout and BridgeDeadline are the run's bounds, as Go
	// duration strings ("" = none).
	Timeout        string `json:"timeout,omitempty"`
	StallTimeout   string `json:"stall_timeout,omitempty"`
	BridgeDeadline string `json:"bridge_deadline,omitempty"`
	// Unsupported lists what the CLI cannot honour.
	Unsupported []string `json:"unsupported,omitempty"`
	// WorkspaceGit is the git source the run's workspace was fetched from:
	// url, ref, commit and snapshot digest (see RunState.WorkspaceGit).
	WorkspaceGit *GitSource `json:"workspace_git,omitempty"`
	// WorkspaceFrom is the earlier run the run's workspace was built from
	// (see RunState.WorkspaceFrom).
	WorkspaceFrom *FromSource `json:"workspace_from,omitempty"`
	// Session is a follow-up's session (see RunState.Session): the
	// earlier run, whether its session was resumed, its id and the digest
	// of the session.tar restored from /run/jetcrew-ws/in.
	Session *SessionNote `json:"session,omitempty"`
}

// ReceiptLimits are a run container's resource limits.
type ReceiptLimits struct {
	MemoryBytes int64   `json:"memory_bytes"`
	CPUs        float64 `json:"cpus"`
	Pids        int64   `json:"pids"`
}

// ReceiptMount is one bind mount, described by its role and content, never
// by its host path (receipts go to every reader of the runs bucket).
type ReceiptMount struct {
	// Target is the path inside the container.
	Target string `json:"target"`
	// Role says what is mounted: one of the MountRole* values.
	Role string `json:"role"`
	// Digest is "sha256:<hex>" of the content: the bridge binary's bytes,
	// or the run directory's staged files; empty for "bind".
	Digest string `json:"digest,omitempty"`
	// ReadOnly is true for a read-only mount.
	ReadOnly bool `json:"read_only"`
}

// Roles of a run's mounts in its receipt (ReceiptMount.Role).
const (
	// MountRoleRunDir is the run's staged directory at /run/jetcrew: its
	// files (ReceiptMount.Digest covers their paths, modes and contents)
	// and the bridge's socket.
	MountRoleRunDir = "run-dir"
	// MountRoleBridge is the jetcrew-bridge binary at /opt/jetcrew/bridge;
	// its digest is the SHA-256 of the binary.
	MountRoleBridge = "bridge"
	// MountRoleWorkspace is the run's writable workspace tree at
	// WorkspaceDir; it carries no digest (the snapshot's mount does).
	MountRoleWorkspace = "workspace"
	// MountRoleSnapshot is the run's workspace snapshot, read-only; its
	// digest is the snapshot's ("sha256:<hex>", as the request names it).
	MountRoleSnapshot = "workspace-snapshot"
	// MountRoleWorkspaceTool is the jetcrew binary that unpacks the
	// snapshot inside the container; its digest is the SHA-256 of the
	// binary.
	MountRoleWorkspaceTool = "workspace-tool"
	// MountRoleWorkspaceGate is the run's read-only gate directory, where
	// the worker lets `jetcrew workspace exec` go on once the capture
	// container holds the workspace; it carries no digest.
	MountRoleWorkspaceGate = "workspace-gate"
	// MountRoleOther is any other bind mount; it carries no digest.
	MountRoleOther = "bind"
)

// ReceiptFile is one file written for a run.
type ReceiptFile struct {
	Path string `json:"path"`
	Mode string `json:"mode"`
}

// HeaderReceipt carries the run's Receipt, as JSON, on its dead letter.
const HeaderReceipt = "Jetcrew-Receipt"

// ReceiptBudgets are a run's model budgets, enforced by its egress proxy
// (zero: none).
type ReceiptBudgets struct {
	// MaxCostUSD is in US dollars by the price table.
	MaxCostUSD float64 `json:"max_cost_usd,omitempty"`
	// MaxOutputTokens counts output tokens.
	MaxOutputTokens int64 `json:"max_output_tokens,omitempty"`
	// MaxModelRequests counts model requests.
	MaxModelRequests int64 `json:"max_model_requests,omitempty"`
	// Group and Pool are the budgets the run shares with its group and
	// its pool, when it has them.
	Group *ReceiptSharedBudget `json:"group,omitempty"`
	Pool  *ReceiptSharedBudget `json:"pool,omitempty"`
	// OnBudget is "fail" or "pause".
	OnBudget string `json:"on_budget,omitempty"`
}

// ReceiptSharedBudget is a budget runs share: its limits (zero: none) and
// window.
type ReceiptSharedBudget struct {
	// Name is the group or pool.
	Name             string  `json:"name"`
	MaxCostUSD       float64 `json:"max_cost_usd,omitempty"`
	MaxOutputTokens  int64   `json:"max_output_tokens,omitempty"`
	MaxModelRequests int64   `json:"max_model_requests,omitempty"`
	// Window is a Go duration string.
	Window string `json:"window"`
}
