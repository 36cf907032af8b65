package console

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// The timeline shows a run's claims and releases, their paths and reasons
// inert.
func TestToLiveClaims(t *testing.T) {
	t.Parallel()
	live := func(ev messages.CoordEvent) liveEvent {
		data, err := json.Marshal(ev)
		require.NoError(t, err)
		_, le := toLive(dispatcher.WatchEvent{Type: messages.EventCoord, Data: data}, nil)
		return le
	}
	le := live(messages.CoordEvent{RunID: "r1", Kind: messages.CoordClaimed, Paths: []string{"src/**", "docs"}, Reason: "store\u202erewrite"})
	require.Equal(t, "claimed", le.Kind)
	require.Equal(t, "claimed src/**, docs: store<U+202E>rewrite", le.Text)
	le = live(messages.CoordEvent{RunID: "r1", Kind: messages.CoordReleased, Paths: []string{"src/**"}, Reason: "run ended"})
	require.Equal(t, "released src/** (run ended)", le.Text)
}
