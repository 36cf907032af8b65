package runstate_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/runstate"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// TestStateStoreRefusesIllegalEdges: the run-state store writes only along
// the edges of messages.Transitions; an illegal edge is an error and leaves
// the record as it was; a stale revision is fenced.
func TestStateStoreRefusesIllegalEdges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc := workertest.Connect(t, workertest.StartServer(t))
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: messages.BucketRuns})
	require.NoError(t, err)
	st := messages.RunState{Version: messages.StateVersion, ID: "r1", State: messages.StateRunning}
	store := runstate.NewStore(kv, js, "test", zerolog.Nop())
	cas := func(ctx context.Context, from messages.State, st messages.RunState, rev uint64) (uint64, error) {
		return store.CAS(ctx, from, &st, rev)
	}

	_, err = cas(ctx, messages.StateNone, st, 0)
	require.ErrorContains(t, err, "illegal run state transition none → running")
	_, err = kv.Get(ctx, "r1")
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "an illegal edge writes nothing")

	st.State = messages.StateQueued
	rev, err := cas(ctx, messages.StateNone, st, 0)
	require.NoError(t, err)

	st.State = messages.StateSucceeded
	_, err = cas(ctx, messages.StateQueued, st, rev)
	require.ErrorContains(t, err, "illegal run state transition queued → succeeded")
	e, err := kv.Get(ctx, "r1")
	require.NoError(t, err)
	require.Equal(t, rev, e.Revision(), "an illegal edge leaves the record as it was")

	st.State = messages.StateRunning
	rev2, err := cas(ctx, messages.StateQueued, st, rev)
	require.NoError(t, err)
	st.State = messages.StateCancelled
	_, err = cas(ctx, messages.StateRunning, st, rev)
	require.ErrorIs(t, err, runstate.ErrFenced, "a stale revision is fenced")
	st.State = messages.StateSucceeded
	_, err = cas(ctx, messages.StateRunning, st, rev2)
	require.NoError(t, err)
}
