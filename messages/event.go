package messages

import "time"

// EventType is the last token of an event subject, jetcrew.events.<run_id>.<type>.
type EventType string

// Event types.
const (
	// EventQueued: a worker received the request (body: Event).
	EventQueued EventType = "queued"
	// EventStarted: the container's process was started (body: Event).
	EventStarted EventType = "started"
	// EventOutput: a chunk of the process's output. The body is the raw
	// bytes, exactly as written (not JSON, not necessarily UTF-8); header
	// HeaderStream says which stream, HeaderOffset where the chunk starts
	// in that stream, in bytes, and HeaderSeq its place among the
	// attempt's chunks of both streams.
	EventOutput EventType = "output"
	// EventFinished: the run reached a final state (body: Event with State).
	EventFinished EventType = "finished"
	// EventDuplicate: a second request for the run id was refused (the run
	// already succeeded, or is still queued or running); body: Event with
	// Reason. The duplicate request is acked and not run.
	EventDuplicate EventType = "duplicate"
	// EventCancel: a cancel request reached the run (body: Event with Reason).
	EventCancel EventType = "cancel"
	// EventAgent: a step the backend read from the agent CLI's output
	// (body: AgentEvent).
	EventAgent EventType = "agent"
	// EventCoord: a coordination step of the run (its bridge connected, a
	// message sent, read or refused); body: CoordEvent.
	EventCoord EventType = "coord"
	// EventEgress: one connection attempt of the run through its egress
	// proxy, allowed or refused (body: EgressEvent). Only profiles with an
	// egress allowlist have them.
	EventEgress EventType = "egress"
	// EventUsage: one model response through the run's egress proxy to a
	// host it injects a key for, with the usage the provider reported
	// (body: UsageEvent).
	EventUsage EventType = "usage"
	// EventBudget: the run sent a model request past one of its budgets;
	// the proxy answered it with the provider's quota error (body:
	// BudgetEvent).
	EventBudget EventType = "budget"
	// EventAdopted: a worker took over the run's live container from the
	// worker that started it, which had stopped or died (body: Event with
	// AdoptedFrom and Gap); the attempt goes on, its agent never
	// restarted (docs/operations.md, "When a worker dies").
	EventAdopted EventType = "adopted"
)

// Headers set on event messages.
const (
	// HeaderRunID carries the run id on every event.
	HeaderRunID = "Jetcrew-Run-Id"
	// HeaderStream carries "stdout" or "stderr" on output events.
	HeaderStream = "Jetcrew-Stream"
	// HeaderOffset carries the byte offset of an output chunk in its stream.
	HeaderOffset = "Jetcrew-Offset"
	// HeaderSeq carries an output chunk's place among its attempt's output
	// chunks of both streams, from 1, in the order the worker read them
	// from the runtime: the order to show stdout and stderr together in
	// (the stream may store a chunk whose first publish failed after later
	// ones). Absent on output events of workers before it: their stream
	// order is the only order.
	HeaderSeq = "Jetcrew-Seq"
	// HeaderOutputEnds carries, on an output chunk, where each stream ends
	// once the chunk is taken: "<stdout bytes>,<stderr bytes>", the next
	// HeaderOffset of each. A worker that adopts a run reads it from the
	// run's last output event and publishes from there on, so no byte is
	// lost or published twice. Absent on output events of workers before it.
	HeaderOutputEnds = "Jetcrew-Output-Ends"
	// HeaderAttempt carries the delivery number the event belongs to.
	HeaderAttempt = "Jetcrew-Attempt"
)

// Headers set on dead letters (stream StreamFailed).
const (
	// HeaderError says why the run failed.
	HeaderError = "Jetcrew-Error"
	// HeaderAttempts is the number of deliveries the run had.
	HeaderAttempts = "Jetcrew-Attempts"
	// HeaderExitCode is the process exit code, when the process ran.
	HeaderExitCode = "Jetcrew-Exit-Code"
	// HeaderWorker is the id of the worker that gave up on the run.
	HeaderWorker = "Jetcrew-Worker"
	// HeaderState is the run's final state.
	HeaderState = "Jetcrew-State"
)

// Output stream names used in HeaderStream.
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
)

// MaxEventPrompt is the most bytes of a run's prompt its started event
// carries (Event.Prompt).
const MaxEventPrompt = 64 << 10

// MaxOutputChunk is the largest body of one output event, in bytes: well below
// the NATS server's default max payload (1 MiB).
const MaxOutputChunk = 32 << 10

// Event is the JSON body of every event except EventOutput.
type Event struct {
	// RunID is the run the event belongs to.
	RunID string `json:"run_id"`
	// Type repeats the subject's last token.
	Type EventType `json:"type"`
	// Time is when the worker emitted the event.
	Time time.Time `json:"time"`
	// Attempt is the delivery number (1 for the first).
	Attempt int `json:"attempt,omitempty"`
	// Worker is the id of the emitting worker.
	Worker string `json:"worker,omitempty"`
	// ContainerID is set on EventStarted and EventFinished.
	ContainerID string `json:"container_id,omitempty"`
	// Warm is true on EventStarted and EventFinished when the run started
	// in a warm container (a profile's warm pool) instead of a new one.
	Warm bool `json:"warm,omitempty"`
	// Prompt is the request's prompt on EventStarted, its secrets masked
	// as the run's output is (the profile's env_from_host values), at
	// most MaxEventPrompt bytes (cut at a whole UTF-8 character): what
	// the run was asked, kept as long as its events, when its request is
	// gone (a worker removes it when the run ends). PromptBytes is the
	// masked prompt's whole size when Prompt was cut, else 0.
	Prompt      string `json:"prompt,omitempty"`
	PromptBytes int    `json:"prompt_bytes,omitempty"`
	// AdoptedFrom is the worker that had the run before, on EventAdopted;
	// Gap is how long, in milliseconds, no worker watched it: from that
	// worker's last record of the run to the adoption.
	AdoptedFrom string `json:"adopted_from,omitempty"`
	GapMS       int64  `json:"gap_ms,omitempty"`
	// State is the run's final state, on EventFinished.
	State State `json:"state,omitempty"`
	// ExitCode is the process's exit code, on EventFinished when it ran.
	ExitCode *int `json:"exit_code,omitempty"`
	// OOMKilled is true on EventFinished when the kernel's OOM killer
	// killed a process of the run (see RunState.OOMKilled).
	OOMKilled bool `json:"oom_killed,omitempty"`
	// Reason explains a non-success EventFinished.
	Reason string `json:"reason,omitempty"`
	// Receipt is the run's profile receipt, on EventFinished.
	Receipt *Receipt `json:"receipt,omitempty"`
	// Result is the agent's final result text, on EventFinished.
	Result string `json:"result,omitempty"`
	// WorkspaceResult is what the run changed in its workspace, on
	// EventFinished when the request named a workspace.
	WorkspaceResult *WorkspaceResult `json:"workspace_result,omitempty"`
	// Usage repeats the run state's model usage on EventFinished, for a
	// run whose proxy meters a host (egress_inject).
	Usage *UsageTotals `json:"usage,omitempty"`
	// Coordination repeats the run state's coordination on EventFinished:
	// "available", "unavailable", "off", or "unused" (the profile has
	// require_bridge = false and the run never reached its bridge).
	Coordination string `json:"coordination,omitempty"`
}

// AgentEvent is the body of an EventAgent: one line of the agent CLI's
// structured output, as the backend understood it.
type AgentEvent struct {
	// RunID is the run.
	RunID string `json:"run_id"`
	// Kind is the CLI's own event type ("system/init", "assistant",
	// "result", "item.completed", ...).
	Kind string `json:"kind"`
	// Text is the human-readable part, if any, at most 4 KiB.
	Text string `json:"text,omitempty"`
}

// EgressEvent is the body of an EventEgress: one connection attempt through
// the run's egress proxy (a CONNECT tunnel or a plain-HTTP request), emitted
// when it is refused or, when allowed, when it ends.
type EgressEvent struct {
	// RunID is the run.
	RunID string `json:"run_id"`
	// Time is when the attempt started.
	Time time.Time `json:"time"`
	// Method is "CONNECT" for a tunnel, else the plain-HTTP request's method;
	// empty (as Host and Port) for a connection refused before its request
	// was read, past the run's cap on connections to its egress proxy.
	Method string `json:"method"`
	// Host is the name (or address) the agent asked for, lowercased.
	Host string `json:"host"`
	// Port is the TCP port asked for.
	Port int `json:"port"`
	// Allowed is true when the proxy let the attempt through.
	Allowed bool `json:"allowed"`
	// Reason says why an attempt was refused ("not in the profile's egress
	// allowlist", "resolves to a private address", "TLS SNI ... does not
	// match", ...) or why an allowed one failed upstream ("upstream
	// certificate not trusted: ...", "upstream refused the connection",
	// "upstream reset the connection", "upstream timed out: ...").
	Reason string `json:"reason,omitempty"`
	// Decision is an operator's answer for a host of the profile's
	// egress_ask list, the attempt waited for: "allowed by alice for the
	// run", "allowed by alice for profile p", "denied by bob for the run",
	// "no answer within 2m0s".
	Decision string `json:"decision,omitempty"`
	// Addr is the address the proxy connected to, when it did.
	Addr string `json:"addr,omitempty"`
	// BytesUp counts the bytes sent from the run to the host.
	BytesUp int64 `json:"bytes_up"`
	// BytesDown counts the bytes received from the host.
	BytesDown int64 `json:"bytes_down"`
	// DurationMS is how long the attempt lasted, in milliseconds.
	DurationMS int64 `json:"duration_ms"`
}

// UpstreamFailed reports whether e is an allowed attempt whose host could
// not be reached or did not answer: Allowed, with a Reason.
func (e EgressEvent) UpstreamFailed() bool { return e.Allowed && e.Reason != "" }

// EgressTotals sums a run's egress attempts, kept in its RunState.
type EgressTotals struct {
	// Allowed counts attempts the proxy let through.
	Allowed int64 `json:"allowed"`
	// Refused counts attempts the proxy refused.
	Refused int64 `json:"refused"`
	// BytesUp and BytesDown sum the bytes of the allowed attempts.
	BytesUp   int64 `json:"bytes_up"`
	BytesDown int64 `json:"bytes_down"`
	// EventsDropped counts attempts not published as events because the
	// run reached its cap on egress events (they are still in the totals).
	EventsDropped int64 `json:"events_dropped,omitempty"`
	// UpstreamFailed counts the allowed attempts whose host could not be
	// reached or did not answer (EgressEvent.UpstreamFailed): a
	// certificate the worker does not trust, a refused, reset or timed-out
	// connection. They are among Allowed too.
	UpstreamFailed int64 `json:"upstream_failed,omitempty"`
}
