package console

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// "Raise budget" on a run that ended meanwhile grants nothing and says
// so (409), as `jetcrew budget` does.
func TestRaiseBudgetOfEndedRun(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	kv := budgetsBucket(t, b.js)
	st := pausedRun("over-1", time.Now().UTC())
	st.State, st.FinishedAt, st.Reason = messages.StateFailed, time.Now().UTC(), "budget reached: max_cost_usd 0.5 (spent 0.5123 USD)"
	b.putStates(t, st)
	resp, body := b.post(t, "/runs/over-1/budget", url.Values{"csrf": {b.c.core.csrf}, "usd": {"1"}})
	require.Equal(t, http.StatusConflict, resp.StatusCode, body)
	require.Contains(t, body, "run over-1 has ended (failed): nothing granted")
	_, err := kv.Get(t.Context(), messages.GrantKey(messages.BudgetScopeRun, "over-1"))
	require.Error(t, err, "nothing granted")
}
