package runner_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// An Exiter sees the exit's plain facts (status, last stderr line) and
// may say the agent never ran, which ends the run failed whatever the
// engine classified (later Exiters see it), or ask for a retry, which
// hands the request back.
func TestEngineExitedVerdicts(t *testing.T) {
	t.Parallel()
	t.Run("not run", func(t *testing.T) {
		t.Parallel()
		ss, _ := stubs("a", "b")
		var seen stage.ExitedRequest
		ss[0].exited = func(req *stage.ExitedRequest, resp *stage.ExitedResponse) {
			seen = *req
			resp.NotRun, resp.Reason = true, "a: never ran"
		}
		var later bool
		ss[1].exited = func(req *stage.ExitedRequest, resp *stage.ExitedResponse) { later = req.NotRun }
		g := newEngine(t, list(ss[0], ss[1]))
		recs := g.run(t, "notrun", "err first; err the tool's line; exit 121")
		st := recs[len(recs)-1]
		require.Equal(t, messages.StateFailed, st.State)
		require.Equal(t, "a: never ran", st.Reason)
		require.Equal(t, 121, seen.Status.Code)
		require.Equal(t, "the tool's line", seen.LastErr)
		require.Equal(t, "exit code 121: the tool's line", seen.Reason, "the engine's own classification")
		require.True(t, later, "a later Exiter sees that the agent never ran")
	})
	t.Run("retry", func(t *testing.T) {
		t.Parallel()
		ss, _ := stubs("a")
		ss[0].exited = func(req *stage.ExitedRequest, resp *stage.ExitedResponse) {
			resp.Retry, resp.Reason = true, "a: not held"
		}
		g := newEngine(t, list(ss[0]))
		recs := g.run(t, "retried", "exit 0")
		st := recs[len(recs)-1]
		require.Equal(t, messages.StateQueued, st.State)
		require.Equal(t, "retrying: a: not held", st.Reason)
		require.False(t, ss[0].releases()[0].Final, "the request is handed back")
	})
}

// The stage.Run a run's stages see is the one of their first hook, to the
// end: a follow-up a stage resumes (PrestartResponse.Resume) runs the
// CLI's resume flag in its container's command, and the Run's plan stays
// the one the stages were built with.
func TestEngineRunUnchanged(t *testing.T) {
	t.Parallel()
	ps, err := profile.ParseProfiles("p.toml", []byte("[profiles.shell]\nbackend = \"codex\"\nimage = \"img\"\ncoordination = false\n"))
	require.NoError(t, err)
	ss, _ := stubs("a", "b")
	var first, last stage.Run
	ss[0].prestart = func(req *stage.PrestartRequest, resp *stage.PrestartResponse) error {
		first, resp.Resume = *req.Run, "t-1"
		return nil
	}
	ss[1].exited = func(req *stage.ExitedRequest, _ *stage.ExitedResponse) { last = *req.Run }
	g := newEngine(t, list(ss[0], ss[1]))
	g.profiles.Store(ps)
	recs := g.run(t, "resumed", "")
	st := recs[len(recs)-1]
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	starts := g.rt.Starts()
	require.Len(t, starts, 1)
	require.Equal(t, []string{"resume", "t-1", "-"}, starts[0].Cmd[len(starts[0].Cmd)-3:], "the container resumes")
	require.NotContains(t, first.Plan.Argv, "t-1")
	first.Failpoint, last.Failpoint = nil, nil // funcs never compare equal
	require.Equal(t, first, last, "nothing of the Run changed after the first hook")
}
