package runner

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/live"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/stage/rundir"
)

// TestAttemptsShareNothing: two deliveries
// of one request on one worker (attempt 1 winding down when attempt 2
// arrives, as after a NATS restart) have their own run directories, the
// first one's cleanup leaves the second's staged files alone, and it
// neither untracks nor overrides the second in the active set.
func TestAttemptsShareNothing(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "r")
	require.NoError(t, os.Mkdir(root, 0o700))
	holds := &stage.Holds{}
	dirs := rundir.New(root, "", 0, holds, zerolog.Nop())
	held := &live.Registry{}
	e := &Runner{live: registry{runs: map[string]*entry{}, held: held}}
	p := profile.ShellProfile()
	attempt := func(n uint64) (*run, *rundir.Stage) {
		r := &run{e: e, req: messages.RunRequest{ID: "across"}, log: zerolog.Nop(),
			meta: &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: 7}, NumDelivered: n}}
		r.sr = &stage.Run{Request: r.req, Profile: &p, Seq: 7, Attempt: int(n), Holds: holds, Log: zerolog.Nop()}
		return r, dirs.For(r.sr)
	}
	a1, d1 := attempt(1)
	a2, d2 := attempt(2)
	_, d1again := attempt(1)
	require.NotEqual(t, d1.Path(), d2.Path())
	require.Equal(t, d1.Path(), d1again.Path(), "an attempt's directory is stable")
	require.LessOrEqual(t, len(filepath.Join(d2.Path(), messages.SocketName)), 107)

	for _, pair := range []struct {
		r *run
		d *rundir.Stage
	}{{a1, d1}, {a2, d2}} {
		require.NoError(t, pair.d.Prestart(t.Context(), &stage.PrestartRequest{Run: pair.r.sr}, &stage.PrestartResponse{}))
	}
	e.live.track(a1, nil)
	e.live.track(a2, nil)
	e.live.track(a1, nil) // attempt 1's container appears late: attempt 2 stays tracked

	// Attempt 1 winds down: its directory goes, attempt 2's stays.
	d1.Release(&stage.ReleaseRequest{Run: a1.sr})
	e.live.untrack(a1)
	_, err := os.Stat(d1.Path())
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = os.Stat(filepath.Join(d2.Path(), messages.MCPConfigName))
	require.NoError(t, err, "attempt 2's staged files survive attempt 1's cleanup")
	require.Same(t, a2, e.live.get("across"), "attempt 1 neither untracks nor overrides attempt 2")
	require.True(t, held.HeldBy(live.Run("across"), live.RunKey+"across"), "the run stays held while attempt 2 is tracked")
	e.live.untrack(a2)
	require.Empty(t, e.live.runs)
	require.False(t, held.Held(live.RunKey+"across"), "no attempt is left: the run is held no more")
}
