package proxy

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// A grant lets a held request go on whichever reads it first: the
// periodic Check (which raises the session's limits) or the pause itself.
// Before, a grant Check read first was lost to the pause, which held the
// request until budget_pause and then refused it.
func TestPausedRunResumesWhenCheckReadsTheGrant(t *testing.T) {
	t.Parallel()
	srv, _ := budgetServer(t)
	prov := newProvider(t)
	r := startMetered(t, srv, prov, "p3", "", "max_model_requests = 1\non_budget = \"pause\"\nbudget_pause = \"30s\"\n")
	require.Equal(t, http.StatusOK, r.post(t))
	done := make(chan int, 1)
	go func() { done <- r.post(t) }()
	require.Eventually(t, func() bool { _, p := r.s.sess.Paused(); return p }, 5*time.Second, 10*time.Millisecond)

	d, err := dispatcher.New(coordtest.Connect(t, srv))
	require.NoError(t, err)
	_, err = d.Grant(context.Background(), messages.BudgetScopeRun, "p3", messages.BudgetSpend{Requests: 1})
	require.NoError(t, err)
	// Check reads the grant before the pause looks (it polls every 500ms).
	require.Eventually(t, func() bool {
		_, _ = r.s.Check(time.Now())
		return r.s.sess.Limits().MaxRequests == 2
	}, 5*time.Second, 5*time.Millisecond)
	select {
	case c := <-done:
		require.Equal(t, http.StatusOK, c)
	case <-time.After(5 * time.Second):
		t.Fatal("the grant Check read did not resume the held request")
	}
}

// While the proxy holds a request at a budget, the run's stall clock
// stands still; it runs again from the request's release.
func TestPauseHoldsTheStallClock(t *testing.T) {
	t.Parallel()
	srv, _ := budgetServer(t)
	prov := newProvider(t)
	r := startMetered(t, srv, prov, "p4", "", "max_model_requests = 1\non_budget = \"pause\"\nbudget_pause = \"30s\"\n")
	prog := &stage.Progress{}
	r.s.run.Progress = prog
	prog.Touch()
	require.Equal(t, http.StatusOK, r.post(t))
	done := make(chan int, 1)
	go func() { done <- r.post(t) }()
	require.Eventually(t, func() bool { _, p := r.s.sess.Paused(); return p }, 5*time.Second, 10*time.Millisecond)
	time.Sleep(100 * time.Millisecond) // time passes while held
	require.Zero(t, prog.Since(), "the stall clock ran while the request was held")

	d, err := dispatcher.New(coordtest.Connect(t, srv))
	require.NoError(t, err)
	_, err = d.Grant(context.Background(), messages.BudgetScopeRun, "p4", messages.BudgetSpend{Requests: 1})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, <-done)
	require.Eventually(t, func() bool { return prog.Since() > 0 }, 5*time.Second, 5*time.Millisecond, "the clock runs again after the release")
	require.Less(t, prog.Since(), 5*time.Second, "the clock restarts from the release, not from before the pause")
}
