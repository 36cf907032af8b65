package messages

import "fmt"

// StateNone stands for "no record yet" as the origin of a transition: the
// first write of a run's record.
const StateNone State = ""

// Transition is one edge of the run state machine: a write of a run's
// record that changes its state From → To, and why it happens.
type Transition struct {
	From, To State
	// Why names the writer and the occasion.
	Why string
}

// Transitions is the run state machine, every edge a writer of the
// jetcrew-runs bucket may take. docs/wire.md draws the same diagram.
//
//	none ─► queued ─► running ─► succeeded | failed | timed_out | stalled | cancelled
//	         ▲ │  ▲      │
//	         │ │  └──────┘ retry, hand back (running → queued)
//	         │ └─► failed | cancelled (invalid request, set-up failure, cancel, MaxDeliver)
//	         └──── failed | timed_out | stalled | cancelled (replay: the same id submitted again)
//
// Succeeded is the one state never left. An unsuccessful final state is left
// only by a replay (back to queued), or for cancelled when a cancel reached
// it while its replay was queued; and it may be rewritten in place to mark
// a cancel pending.
var Transitions = []Transition{
	{StateNone, StateQueued, "a worker's claim creates the record (a submitter writes none; an older client's queued record is still accepted)"},
	{StateNone, StateCancelled, "cancel before any worker saw the request"},
	{StateNone, StateFailed, "MaxDeliver exhausted before any state was written"},
	{StateQueued, StateQueued, "claim by a delivery; retry of a set-up failure; the warm container named before its hand-off"},
	{StateQueued, StateRunning, "container started"},
	{StateQueued, StateFailed, "invalid request, set-up failure, retries exhausted, MaxDeliver"},
	{StateQueued, StateCancelled, "cancel while queued"},
	{StateRunning, StateRunning, "bridge connected, progress recorded; adopted by a successor of its worker"},
	{StateRunning, StateQueued, "claim by a redelivery; retry (infrastructure, profile retries); hand back on shutdown"},
	{StateRunning, StateSucceeded, "exit 0"},
	{StateRunning, StateFailed, "non-zero exit, OOM, bridge never reached, MaxDeliver"},
	{StateRunning, StateTimedOut, "timeout"},
	{StateRunning, StateStalled, "stall watchdog"},
	{StateRunning, StateCancelled, "cancel"},
	{StateFailed, StateQueued, "replay"},
	{StateTimedOut, StateQueued, "replay"},
	{StateStalled, StateQueued, "replay"},
	{StateCancelled, StateQueued, "replay"},
	{StateFailed, StateFailed, "cancel pending marked"},
	{StateTimedOut, StateTimedOut, "cancel pending marked"},
	{StateStalled, StateStalled, "cancel pending marked"},
	{StateCancelled, StateCancelled, "cancel pending marked"},
	{StateFailed, StateCancelled, "a replay skipped: cancelled while queued"},
	{StateTimedOut, StateCancelled, "a replay skipped: cancelled while queued"},
	{StateStalled, StateCancelled, "a replay skipped: cancelled while queued"},
}

// CanTransition reports whether a run's record may go from state from
// (StateNone: no record yet) to state to: whether the edge is in
// Transitions.
func CanTransition(from, to State) bool {
	for _, t := range Transitions {
		if t.From == from && t.To == to {
			return true
		}
	}
	return false
}

// CheckTransition returns nil when from → to is an edge of the run state
// machine, else an error naming the edge.
func CheckTransition(from, to State) error {
	if CanTransition(from, to) {
		return nil
	}
	name := string(from)
	if from == StateNone {
		name = "none"
	}
	return fmt.Errorf("illegal run state transition %s → %s", name, to)
}
