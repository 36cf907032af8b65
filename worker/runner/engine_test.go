package runner_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// The engine calls the hooks in list order, Release in reverse order and
// once, and skips a stage for a hook it does not implement: Prestart,
// Poststart (before the running state, so Note first then), the checks
// while the container runs, Exited, Note before the final write, Release.
func TestEngineHookOrder(t *testing.T) {
	t.Parallel()
	ss, c := stubs("a", "b")
	g := newEngine(t, list(ss[0], named("bare"), ss[1]))
	var seen []string
	ss[0].exited = func(req *stage.ExitedRequest, resp *stage.ExitedResponse) { resp.Reason = "a's reason" }
	ss[1].exited = func(req *stage.ExitedRequest, resp *stage.ExitedResponse) { seen = append(seen, req.Reason) }
	recs := g.run(t, "order", "sleep 150ms")
	st := recs[len(recs)-1]
	require.Equal(t, messages.StateSucceeded, st.State)
	require.Equal(t, "a's reason", st.Reason, "an Exiter's reason replaces the outcome's")
	require.Equal(t, []string{"a's reason"}, seen, "each Exiter sees the outcome as the ones before it left it")

	got := c.get()
	checks := slices.DeleteFunc(slices.Clone(got), func(s string) bool { return s != "a check" && s != "b check" })
	require.GreaterOrEqual(t, len(checks), 2, "the checks ran while the container ran: %v", got)
	for i, s := range checks {
		require.Equal(t, []string{"a check", "b check"}[i%2], s, "each check round calls the Checkers in list order: %v", got)
	}
	first, last := slices.Index(got, "a check"), slices.Index(got, "a exited")
	require.Equal(t, []string{"a prestart", "b prestart", "a poststart", "b poststart", "a note", "b note"}, got[:first],
		"before the checks: Prestart, Poststart, then Note for the running state")
	require.Len(t, slices.DeleteFunc(slices.Clone(got[first:last]), func(s string) bool { return s == "a check" || s == "b check" }), 0,
		"only checks while the container runs (none changed the record)")
	require.Equal(t, []string{"a exited", "b exited", "a note", "b note", "b release", "a release"}, got[last:],
		"after the exit: Exited, Note for the final state, Release in reverse order, once")
	for _, s := range ss {
		rel := s.releases()
		require.Len(t, rel, 1)
		require.True(t, rel[0].Final)
		require.True(t, rel[0].ContainerGone)
	}
}

// A Prestart error fails the run with its text as the reason: no later
// Prestarter runs, no container starts, and every stage of the list is
// released, in reverse order, once, the run final.
func TestEnginePrestartError(t *testing.T) {
	t.Parallel()
	ss, c := stubs("a", "b", "c")
	ss[1].prestart = func(*stage.PrestartRequest, *stage.PrestartResponse) error { return errors.New("b cannot stage") }
	g := newEngine(t, list(ss[0], ss[1], ss[2]))
	recs := g.run(t, "prefail", "exit 0")
	st := recs[len(recs)-1]
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, "b cannot stage", st.Reason)
	require.Empty(t, g.rt.Starts(), "no container starts")
	require.Equal(t, []string{"a prestart", "b prestart", "a note", "b note", "c note", "c release", "b release", "a release"}, c.get())
	for _, s := range ss {
		require.Equal(t, []stage.ReleaseRequest{{Run: s.releases()[0].Run, Final: true, ContainerGone: true}}, s.releases(),
			"%s: released once, final, no container ever made", s.name)
	}
}

// A Prestart error wrapped by stage.Transient hands the request back for a
// retry: the run is queued again, and its stages are released in reverse
// order, not final.
func TestEnginePrestartTransient(t *testing.T) {
	t.Parallel()
	ss, c := stubs("a", "b")
	ss[1].prestart = func(*stage.PrestartRequest, *stage.PrestartResponse) error {
		return stage.Transient(errors.New("store unreachable"))
	}
	g := newEngine(t, list(ss[0], ss[1]))
	recs := g.run(t, "transient", "exit 0")
	st := recs[len(recs)-1]
	require.Equal(t, messages.StateQueued, st.State)
	require.Equal(t, "retrying: store unreachable", st.Reason)
	require.Empty(t, g.rt.Starts())
	require.Equal(t, []string{"a prestart", "b prestart", "b release", "a release", "a note", "b note"}, c.get(),
		"released before the queued state is written")
	for _, s := range ss {
		rel := s.releases()
		require.Len(t, rel, 1)
		require.False(t, rel[0].Final, "%s: the request is handed back", s.name)
	}
}

// The first stop asked for wins, whatever is asked later; one check round
// that finds several takes the most overdue, wherever it is in the list.
func TestEngineFirstStopWins(t *testing.T) {
	t.Parallel()
	t.Run("first asked", func(t *testing.T) {
		t.Parallel()
		ss, _ := stubs("a", "b")
		secondAsked := make(chan struct{})
		ss[0].check = func(int) (*stage.Stop, bool) {
			return &stage.Stop{State: messages.StateFailed, Reason: "a stops first", Overdue: time.Millisecond}, false
		}
		ss[1].check = func(round int) (*stage.Stop, bool) {
			if round < 2 {
				return nil, false
			}
			if round == 2 {
				close(secondAsked)
			}
			return &stage.Stop{State: messages.StateStalled, Reason: "b stops later, more overdue", Overdue: time.Hour}, false
		}
		g := newEngine(t, list(ss[0], ss[1]))
		// The container outlives its stop until b asked too.
		g.rt.Behave = func(jail.ContainerSpec) (workertest.Behaviour, error) {
			return func(ctx context.Context, _ jail.ContainerSpec, _ jail.OutputFunc) jail.ExitStatus {
				<-ctx.Done()
				select {
				case <-secondAsked:
				case <-time.After(10 * time.Second):
				}
				return jail.ExitStatus{Code: 143}
			}, nil
		}
		recs := g.run(t, "first", "")
		st := recs[len(recs)-1]
		require.Equal(t, messages.StateFailed, st.State)
		require.Equal(t, "a stops first", st.Reason)
		select {
		case <-secondAsked:
		default:
			t.Fatal("b never asked for its stop")
		}
	})
	t.Run("one round", func(t *testing.T) {
		t.Parallel()
		ss, _ := stubs("a", "b", "c")
		for i, over := range []time.Duration{time.Second, 5 * time.Second, 2 * time.Second} {
			state := messages.StateFailed
			if i == 1 {
				state = messages.StateStalled
			}
			stop := &stage.Stop{State: state, Reason: ss[i].name + " stops", Overdue: over}
			ss[i].check = func(int) (*stage.Stop, bool) { return stop, false }
		}
		g := newEngine(t, list(ss[0], ss[1], ss[2]))
		recs := g.run(t, "round", "sleep 10s")
		st := recs[len(recs)-1]
		require.Equal(t, messages.StateStalled, st.State)
		require.Equal(t, "b stops", st.Reason, "the most overdue of the round")
	})
}

// Each Noter writes its part before every write of the record once the
// stage list exists (the claim, before it, has none): what it wrote is in
// the record stored, a write a Checker asked for (changed) included.
func TestEngineNotes(t *testing.T) {
	t.Parallel()
	ss, _ := stubs("a", "b")
	ss[0].note = noted()
	ss[1].note = func(st *messages.RunState) { st.Coordination = "b's part" }
	ss[1].check = func(round int) (*stage.Stop, bool) { return nil, round == 1 }
	g := newEngine(t, list(ss[0], ss[1]))
	recs := g.run(t, "notes", "sleep 150ms")
	var states, notes, coord []string
	for _, st := range recs {
		states, notes, coord = append(states, string(st.State)), append(notes, st.Budget), append(coord, st.Coordination)
	}
	require.Equal(t, []string{"queued", "running", "running", "succeeded"}, states, "claim, running, the check's write, final")
	require.Equal(t, []string{"", "note 1", "note 2", "note 3"}, notes)
	require.Equal(t, []string{"", "b's part", "b's part", "b's part"}, coord, "a later Noter's part lands too")
}

// Release says whether the run's container is gone as the engine knows
// it: removed, or never made (true); its removal failed (false).
func TestEngineContainerGone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		removeErr bool
		prestart  error
		gone      bool
	}{
		{name: "removed", gone: true},
		{name: "removal failed", removeErr: true, gone: false},
		{name: "never made", prestart: errors.New("refused"), gone: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ss, _ := stubs("a")
			ss[0].prestart = func(*stage.PrestartRequest, *stage.PrestartResponse) error { return tc.prestart }
			g := newEngine(t, list(ss[0]))
			if tc.removeErr {
				g.rt.RemoveErr = func(string) error { return errors.New("engine unreachable") }
			}
			g.run(t, "gone", "exit 0")
			rel := ss[0].releases()
			require.Len(t, rel, 1)
			require.Equal(t, tc.gone, rel[0].ContainerGone)
			require.Equal(t, !tc.removeErr, g.rt.Live() == 0)
		})
	}
}

// What each Prestarter adds reaches the container's spec, in list order:
// its environment after the engine's, its mounts (and their receipt
// entries), its files (in the receipt), its wrap as the command's head (a later stage's outermost),
// its working directory (the last one set); each Prestarter reads the
// engine's spec, before any addition, and the directory an earlier one
// staged.
func TestEnginePrestartMerge(t *testing.T) {
	t.Parallel()
	ss, _ := stubs("a", "b")
	srcA, srcB := t.TempDir(), t.TempDir()
	d := &fakeDir{}
	var base jail.ContainerSpec
	ss[0].prestart = func(req *stage.PrestartRequest, resp *stage.PrestartResponse) error {
		base = *req.Spec
		resp.Env, resp.Wrap, resp.WorkingDir, resp.Dir = []string{"A=1"}, []string{"wrap-a", "--"}, "/a", d
		resp.Mounts = []stage.Mount{{Mount: jail.Mount{Source: srcA, Target: "/mnt/a", ReadOnly: true}, Role: messages.MountRoleRunDir, Digest: "sha256:aa"}}
		resp.Files = []messages.ReceiptFile{{Path: "/run/jetcrew/a.json", Mode: "0444"}}
		return nil
	}
	var bSpec jail.ContainerSpec
	var bDir stage.Dir
	ss[1].prestart = func(req *stage.PrestartRequest, resp *stage.PrestartResponse) error {
		bSpec, bDir = *req.Spec, req.Dir
		resp.Env, resp.Wrap, resp.WorkingDir = []string{"B=2"}, []string{"wrap-b", "--"}, "/b"
		resp.Mounts = []stage.Mount{{Mount: jail.Mount{Source: srcB, Target: "/mnt/b"}, Role: messages.MountRoleBridge, Digest: "sha256:bb"}}
		resp.Files = []messages.ReceiptFile{{Path: "/run/jetcrew/b.json", Mode: "0400"}}
		return nil
	}
	g := newEngine(t, list(ss[0], ss[1]))
	recs := g.run(t, "merge", "exit 0")
	st := recs[len(recs)-1]
	require.Equal(t, messages.StateSucceeded, st.State)

	require.Equal(t, base, bSpec, "a later Prestarter reads the engine's spec, not an earlier one's additions")
	require.Same(t, d, bDir, "a later Prestarter reads the directory an earlier one staged")
	require.Contains(t, base.Env, "JETCREW_RUN_ID=merge")
	starts := g.rt.Starts()
	require.Len(t, starts, 1)
	spec := starts[0]
	require.Equal(t, append(slices.Clone(base.Env), "A=1", "B=2"), spec.Env)
	require.Equal(t, append(slices.Clone(base.Mounts), jail.Mount{Source: srcA, Target: "/mnt/a", ReadOnly: true}, jail.Mount{Source: srcB, Target: "/mnt/b"}), spec.Mounts)
	require.Equal(t, append([]string{"wrap-b", "--", "wrap-a", "--"}, base.Cmd...), spec.Cmd)
	require.Equal(t, "/b", spec.WorkingDir)
	require.NotNil(t, st.Receipt)
	require.Equal(t, []messages.ReceiptMount{
		{Target: "/mnt/a", ReadOnly: true, Role: messages.MountRoleRunDir, Digest: "sha256:aa"},
		{Target: "/mnt/b", Role: messages.MountRoleBridge, Digest: "sha256:bb"},
	}, st.Receipt.Mounts)
	require.Equal(t, []messages.ReceiptFile{{Path: "/run/jetcrew/a.json", Mode: "0444"}, {Path: "/run/jetcrew/b.json", Mode: "0400"}}, st.Receipt.Files,
		"the stages' files, in list order (the shell plan stages none)")
}

// A run's placement, as its stages see it: a cold run today.
func TestEnginePlacement(t *testing.T) {
	t.Parallel()
	t.Run("cold", func(t *testing.T) {
		t.Parallel()
		ss, _ := stubs("a", "b")
		var seen []*stage.Run
		for _, s := range ss {
			s.prestart = func(req *stage.PrestartRequest, _ *stage.PrestartResponse) error {
				seen = append(seen, req.Run)
				return nil
			}
		}
		g := newEngine(t, list(ss[0], ss[1]))
		recs := g.run(t, "cold", "exit 0")
		require.Len(t, seen, 2)
		require.Same(t, seen[0], seen[1], "every stage is handed the one Run")
		requireCold(t, seen[0], recs[len(recs)-1])
		require.Len(t, g.rt.Starts(), 1, "a cold run starts its own container")
	})
}

// requireCold checks that run, as its stages saw it, and its final record
// st say the run was placed cold: no warm container claimed or handed.
func requireCold(t *testing.T, run *stage.Run, st messages.RunState) {
	t.Helper()
	require.False(t, run.Placement.Warm())
	require.Empty(t, run.Placement.Dir)
	require.Nil(t, run.Placement.Workspace)
	require.False(t, st.Warm)
	require.NotNil(t, st.Receipt)
	require.False(t, st.Receipt.Warm)
}

// fakeDir is a stage.Dir no one calls.
type fakeDir struct{ stage.Dir }
