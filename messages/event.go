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
	// HeaderStream says which stream and HeaderOffset where the chunk starts
	// in that stream, in bytes.
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
	// message sent, read or refused); the body is the coordination
	// package's Event JSON.
	EventCoord EventType = "coord"
)

// Headers set on event messages.
const (
	// HeaderRunID carries the run id on every event.
	HeaderRunID = "Jetcrew-Run-Id"
	// HeaderStream carries "stdout" or "stderr" on output events.
	HeaderStream = "Jetcrew-Stream"
	// HeaderOffset carries the byte offset of an output chunk in its stream.
	HeaderOffset = "Jetcrew-Offset"
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
	// State is the run's final state, on EventFinished.
	State State `json:"state,omitempty"`
	// ExitCode is the process's exit code, on EventFinished when it ran.
	ExitCode *int `json:"exit_code,omitempty"`
	// Reason explains a non-success EventFinished.
	Reason string `json:"reason,omitempty"`
	// Receipt is the run's profile receipt, on EventFinished.
	Receipt *Receipt `json:"receipt,omitempty"`
	// Result is the agent's final result text, on EventFinished.
	Result string `json:"result,omitempty"`
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
