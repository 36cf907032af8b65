package messages

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTransitions checks CanTransition over every pair of states (none
// included) against the state machine drawn in docs/wire.md.
func TestTransitions(t *testing.T) {
	t.Parallel()
	all := []State{StateNone, StateQueued, StateRunning, StateSucceeded, StateFailed, StateCancelled, StateTimedOut, StateStalled}
	unsuccessful := []State{StateQueued, StateCancelled} // from failed, timed_out, stalled: replay, skipped replay
	allowed := map[State][]State{
		StateNone:      {StateQueued, StateCancelled, StateFailed},
		StateQueued:    {StateQueued, StateRunning, StateFailed, StateCancelled},
		StateRunning:   {StateRunning, StateQueued, StateSucceeded, StateFailed, StateTimedOut, StateStalled, StateCancelled},
		StateSucceeded: nil,
		StateFailed:    append([]State{StateFailed}, unsuccessful...),
		StateTimedOut:  append([]State{StateTimedOut}, unsuccessful...),
		StateStalled:   append([]State{StateStalled}, unsuccessful...),
		StateCancelled: {StateCancelled, StateQueued},
	}
	for _, from := range all {
		for _, to := range all {
			want := false
			for _, a := range allowed[from] {
				want = want || a == to
			}
			require.Equal(t, want, CanTransition(from, to), "%q → %q", from, to)
			if want {
				require.NoError(t, CheckTransition(from, to))
			} else {
				require.Error(t, CheckTransition(from, to))
			}
		}
	}
	require.False(t, CanTransition(StateQueued, StateNone), "a record is never deleted by a transition")
	require.EqualError(t, CheckTransition(StateNone, StateRunning), "illegal run state transition none → running")
}
