package dispatcher

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// GrantRun grants a running or queued run, a replay's queued request
// included, and refuses, granting nothing, a run that has ended
// (ErrRunEnded) or that nothing knows (ErrRunNotFound).
func TestGrantRun(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	kv, err := b.js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	put := func(id string, s messages.State, seq ...uint64) {
		st := messages.RunState{Version: messages.StateVersion, ID: id, State: s, Pool: messages.DefaultPool}
		if len(seq) > 0 {
			st.StreamSeq = seq[0]
		}
		data, err := json.Marshal(st)
		require.NoError(t, err)
		_, err = kv.Put(t.Context(), id, data)
		require.NoError(t, err)
	}
	queue := func(id string) uint64 {
		data, err := json.Marshal(messages.RunRequest{ID: id, Profile: "shell", Prompt: "x"})
		require.NoError(t, err)
		ack, err := b.js.Publish(t.Context(), messages.SubjectRuns(messages.DefaultPool), data)
		require.NoError(t, err)
		return ack.Sequence
	}
	one := messages.BudgetSpend{CostUSD: 1}

	put("running", messages.StateRunning)
	g, err := b.d.GrantRun(t.Context(), "running", one)
	require.NoError(t, err)
	require.Equal(t, RunGrant{Total: one, State: messages.StateRunning}, g)

	queue("waiting")
	g, err = b.d.GrantRun(t.Context(), "waiting", one)
	require.NoError(t, err)
	require.Equal(t, messages.StateQueued, g.State)

	put("replayed", messages.StateFailed)
	queue("replayed")
	g, err = b.d.GrantRun(t.Context(), "replayed", one)
	require.NoError(t, err)
	require.Equal(t, messages.StateQueued, g.State, "a replay waits")

	// Its final state written, its request not yet removed: ended.
	put("ending", messages.StateFailed, queue("ending"))
	_, err = b.d.GrantRun(t.Context(), "ending", one)
	require.True(t, errors.Is(err, ErrRunEnded), "a run whose request is being removed has ended: %v", err)

	put("done", messages.StateStalled)
	_, err = b.d.GrantRun(t.Context(), "done", one)
	require.True(t, errors.Is(err, ErrRunEnded), "%v", err)
	require.EqualError(t, err, "run done has ended (stalled): nothing granted")

	_, err = b.d.GrantRun(t.Context(), "nobody", one)
	require.True(t, errors.Is(err, ErrRunNotFound), "%v", err)

	budgets, err := b.js.KeyValue(t.Context(), messages.BucketBudgets)
	require.NoError(t, err)
	for _, id := range []string{"ending", "done", "nobody"} {
		_, err := budgets.Get(t.Context(), messages.GrantKey(messages.BudgetScopeRun, id))
		require.Error(t, err, "%s was granted", id)
	}
}
