package messages

import (
	"time"
)

// State is the lifecycle state of a run, as stored in RunState.State.
type State string

// Run states. A run moves queued → running → one of the final states; see
// Transitions for every edge, the retry, hand-back and replay ones included.
const (
	// StateQueued: the request is on the stream and no worker has started it.
	StateQueued State = "queued"
	// StateRunning: a worker holds the run and its container exists.
	StateRunning State = "running"
	// StateSucceeded: the process exited 0. Final.
	StateSucceeded State = "succeeded"
	// StateFailed: the request was invalid, the run could not be set up, or
	// the process exited non-zero. Final.
	StateFailed State = "failed"
	// StateCancelled: an operator cancelled the run. Final.
	StateCancelled State = "cancelled"
	// StateTimedOut: the run outlived its timeout and was stopped. Final.
	StateTimedOut State = "timed_out"
	// StateStalled: the run showed no progress (no output, no coordination
	// traffic) for its profile's stall timeout and was stopped. Final.
	StateStalled State = "stalled"
)

// Final reports whether s is a final state: one that ends a request. Only a
// replay (the same run id submitted again) leaves an unsuccessful one; see
// Transitions.
func (s State) Final() bool {
	switch s {
	case StateSucceeded, StateFailed, StateCancelled, StateTimedOut, StateStalled:
		return true
	}
	return false
}

// Unsuccessful reports whether s is a final state that ends a run without
// success and with a dead letter: failed, timed_out or stalled (a cancelled
// run is neither successful nor dead-lettered). A replay runs such a run
// again (Transitions).
func (s State) Unsuccessful() bool {
	switch s {
	case StateFailed, StateTimedOut, StateStalled:
		return true
	}
	return false
}

// StateVersion is the version of the RunState document format.
const StateVersion = 1

// RunState is the record of one run, stored as JSON under the run's id in
// the key-value bucket BucketRuns. Every write replaces the whole record.
type RunState struct {
	// Version is StateVersion.
	Version int `json:"version"`
	// ID is the run id (the bucket key).
	ID string `json:"id"`
	// State is the lifecycle state.
	State State `json:"state"`
	// Profile is the profile the request named.
	Profile string `json:"profile"`
	// Pool is the pool the request was published to.
	Pool string `json:"pool"`
	// Group is the coordination group (the run id when the request named
	// none: its own group), once a worker admitted the run to it; empty
	// before (docs/security.md, "Groups and pools").
	Group string `json:"group,omitempty"`
	// Worker is the id of the worker that last held the run.
	Worker string `json:"worker,omitempty"`
	// ContainerID is the Docker container id of the latest attempt.
	ContainerID string `json:"container_id,omitempty"`
	// Warm is true when the run started in a warm container (a profile's
	// warm pool, claimed and handed the run) instead of a new one.
	Warm bool `json:"warm,omitempty"`
	// ExitCode is the process exit code; nil until the process has exited.
	ExitCode *int `json:"exit_code,omitempty"`
	// OOMKilled is true when the kernel's OOM killer killed a process of
	// the run (the main one or a child) at the memory limit. The outcome
	// follows the main process's exit code: a non-zero exit with an OOM
	// kill is failed, reason "oom"; a main process that survives a child's
	// OOM kill and exits 0 is succeeded, with OOMKilled still true.
	OOMKilled bool `json:"oom_killed,omitempty"`
	// StreamSeq is the JETCREW_RUNS stream sequence of the request message
	// this state belongs to; 0 until a worker has seen it. A message for the
	// same run id with another sequence is a duplicate or a replay.
	StreamSeq uint64 `json:"stream_seq,omitempty"`
	// RequestDigest is RequestDigest of the request message this state
	// belongs to, byte for byte as published: a message for the same run id
	// with another digest is another request, never a redelivery or a
	// replay of this one. Empty in states written before it existed.
	RequestDigest string `json:"request_digest,omitempty"`
	// Attempts counts deliveries of the request that reached a worker
	// (the JetStream delivery count, NumDelivered).
	Attempts int `json:"attempts"`
	// CancelPending is set when a cancel request reached a run that had
	// already ended unsuccessfully: a replay of it still queued is skipped
	// (recorded cancelled) when it arrives.
	CancelPending bool `json:"cancel_pending,omitempty"`
	// Adoptions counts the times a worker took the run's live container
	// over from the worker that started it (or adopted it before), after
	// that one stopped or died; the attempt (Attempts) stays the same.
	Adoptions int `json:"adoptions,omitempty"`
	// Lease is the acknowledgement subject of the request's delivery that
	// holds the run: the reply subject JetStream delivered it with
	// ($JS.ACK.…). A worker that adopts the run keeps the request in
	// progress and acknowledges or terminates it there: the server acts on
	// the stream sequence the subject names, whichever delivery's subject
	// it is (nats-server's consumer acks and progress by stream sequence).
	Lease string `json:"lease,omitempty"`
	// Replays counts the times a finished, unsuccessful run was submitted
	// again and run anew (a replay of its dead letter).
	Replays int `json:"replays,omitempty"`
	// Reason says why the run ended as it did when that is not plain
	// success: "exit code 3", "unknown profile \"x\"", "oom", ...
	Reason string `json:"reason,omitempty"`
	// Result is the final result text, when the profile's backend extracts
	// one (for the shell profile: empty).
	Result string `json:"result,omitempty"`
	// Agent holds what the backend read from the agent CLI's output: cost,
	// turns, whether the CLI reported an error.
	Agent *AgentSummary `json:"agent,omitempty"`
	// Coordination is "available" when the run's bridge socket was served,
	// "unavailable" when it could not be (the agent's tool calls then say
	// so), "off" when the profile turned coordination off, "unused" when
	// it was served but the run never reached it and its profile allows
	// that (require_bridge = false).
	Coordination string `json:"coordination,omitempty"`
	// BridgeConnected is true once the run's bridge reached its socket.
	BridgeConnected bool `json:"bridge_connected"`
	// Egress sums the run's attempts through its egress proxy, for a
	// profile with an egress allowlist (see EgressEvent).
	Egress *EgressTotals `json:"egress,omitempty"`
	// Usage sums the run's model usage, metered by its egress proxy on the
	// hosts it injects a key for (see UsageEvent): running totals while
	// it runs (written about every half second when they changed), the
	// final ones when it ends.
	Usage *UsageTotals `json:"usage,omitempty"`
	// Budget says which budget the run reached, when it did ("budget
	// reached: max_cost_usd 0.5 (spent 0.5123 USD)").
	Budget string `json:"budget,omitempty"`
	// OutputBytes counts the bytes of stdout and stderr published as events.
	OutputBytes int64 `json:"output_bytes"`
	// OutputDroppedBytes counts the bytes of stdout and stderr past the
	// profile's output budget (max_output_mib): counted, not published.
	OutputDroppedBytes int64 `json:"output_dropped_bytes,omitempty"`
	// Labels are copied from the request.
	Labels map[string]string `json:"labels,omitempty"`
	// QueuedAt is when the request was published (the stream's timestamp).
	QueuedAt time.Time `json:"queued_at,omitzero"`
	// StartedAt is when the container was started.
	StartedAt time.Time `json:"started_at,omitzero"`
	// FinishedAt is when the run reached its final state.
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// UpdatedAt is when this record was written.
	UpdatedAt time.Time `json:"updated_at"`
	// Receipt describes the effective profile the run used (no secrets).
	Receipt *Receipt `json:"receipt,omitempty"`
	// WorkspaceResult is what the run changed in its workspace, when the
	// request named one; recorded with the final state.
	WorkspaceResult *WorkspaceResult `json:"workspace_result,omitempty"`
	// WorkspaceGit is the git source of a request whose workspace names a
	// git remote, once the worker resolved it: url, ref, the commit the
	// ref named (the result's base) and the snapshot's digest.
	WorkspaceGit *GitSource `json:"workspace_git,omitempty"`
	// WorkspaceFrom is the earlier run a request's workspace named
	// (WorkspaceRef.From), once the worker built its snapshot: the run,
	// the snapshot's HEAD (the earlier run's head, this run's result
	// base) and the snapshot's digest.
	WorkspaceFrom *FromSource `json:"workspace_from,omitempty"`
	// Session is what the run did with the agent CLI's session: for a
	// follow-up, whether the earlier run's was resumed or why not.
	Session *SessionNote `json:"session,omitempty"`
}

// AgentSummary is what an agent CLI reported about its own run.
type AgentSummary struct {
	// IsError is true when the CLI reported that the task failed.
	IsError bool `json:"is_error,omitempty"`
	// CostUSD is the CLI's reported cost, in US dollars.
	CostUSD float64 `json:"cost_usd,omitempty"`
	// Turns is the CLI's reported number of turns.
	Turns int `json:"turns,omitempty"`
	// MCPServers maps each MCP server the CLI reported to its status
	// ("connected", "failed").
	MCPServers map[string]string `json:"mcp_servers,omitempty"`
	// SessionID is the CLI's session id, the latest it named (Claude
	// Code's events' session_id: a resumed conversation goes on under a
	// new id; Codex's thread.started thread_id, opencode's sessionID),
	// which a follow-up passes to the CLI's resume flag; only an id
	// ValidSessionID accepts is kept.
	SessionID string `json:"session_id,omitempty"`
}

// GroupRef returns the group a worker admitted run s to: its own when
// Group is its run id (a request's group is never its own id). Before the
// run is admitted, Group is empty and so is the returned Name.
func (s RunState) GroupRef() GroupRef {
	return GroupRef{Pool: s.Pool, Name: s.Group, Own: s.Group != "" && s.Group == s.ID}
}
