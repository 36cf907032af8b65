package runner

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
)

// TestAttemptsShareNothing proves issue 13 item 17's rule: two deliveries
// of one request on one worker (attempt 1 winding down when attempt 2
// arrives, as after a NATS restart) have their own run directories, the
// first one's cleanup leaves the second's staged files alone, and it
// neither untracks nor overrides the second in the active set.
func TestAttemptsShareNothing(t *testing.T) {
	t.Parallel()
	w := &Worker{cfg: Config{StateDir: t.TempDir()}, active: map[string]*activeRun{}, log: zerolog.Nop()}
	attempt := func(n uint64) *run {
		return &run{w: w, req: messages.RunRequest{ID: "across"}, log: zerolog.Nop(),
			meta: &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: 7}, NumDelivered: n}}
	}
	a1, a2 := attempt(1), attempt(2)
	require.NotEqual(t, a1.dir(), a2.dir())
	require.Equal(t, a1.dir(), attempt(1).dir(), "an attempt's directory is stable")
	require.LessOrEqual(t, len(filepath.Join(a2.dir(), coordination.SocketName)), 107)

	for _, r := range []*run{a1, a2} {
		require.NoError(t, coordination.StageRunDir(r.dir()))
	}
	w.track(a1, nil)
	w.track(a2, nil)
	w.track(a1, nil) // attempt 1's container appears late: attempt 2 stays tracked

	// Attempt 1 winds down: its directory goes, attempt 2's stays.
	cs1 := &coordSession{dir: a1.dir()}
	cs1.end(a1, false)
	w.untrack(a1)
	_, err := os.Stat(a1.dir())
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = os.Stat(filepath.Join(a2.dir(), coordination.MCPConfigName))
	require.NoError(t, err, "attempt 2's staged files survive attempt 1's cleanup")
	require.Same(t, a2, w.active["across"].run, "attempt 1 neither untracks nor overrides attempt 2")
	w.untrack(a2)
	require.Empty(t, w.active)
}
