package runstate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

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

// A record the server relayed into the bucket (another stream's RePublish)
// is no record of a worker's: Load reads past it to the newest a worker
// wrote, a delivery holding the run writes over it (its lease holds), and a
// run whose only record was relayed has none. (Under package roles only
// workers configure streams; this is for a server whose permissions let
// someone else.)
func TestStateStoreRefusesRelayedRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc := workertest.Connect(t, workertest.StartServer(t))
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: messages.BucketRuns, History: 5})
	require.NoError(t, err)
	store := runstate.NewStore(kv, js, "test", zerolog.Nop())
	relay := func(id string, st messages.RunState) {
		t.Helper()
		name := "RELAY_" + id
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"relay." + id},
			RePublish: &jetstream.RePublish{Source: "relay." + id, Destination: "$KV." + messages.BucketRuns + "." + id}})
		require.NoError(t, err)
		b, err := json.Marshal(st)
		require.NoError(t, err)
		_, err = js.Publish(ctx, "relay."+id, b)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			e, err := kv.Get(ctx, id)
			return err == nil && bytes.Equal(e.Value(), b)
		}, 5*time.Second, 10*time.Millisecond)
	}
	zero := 0

	// A running run; then a relayed "succeeded".
	st := messages.RunState{Version: messages.StateVersion, ID: "r1", State: messages.StateQueued}
	rev, err := store.CAS(ctx, messages.StateNone, &st, 0)
	require.NoError(t, err)
	st.State = messages.StateRunning
	rev, err = store.CAS(ctx, messages.StateQueued, &st, rev)
	require.NoError(t, err)
	relay("r1", messages.RunState{Version: messages.StateVersion, ID: "r1", State: messages.StateSucceeded, ExitCode: &zero})

	got, loadRev, err := store.Load(ctx, "r1")
	require.NoError(t, err)
	require.Equal(t, messages.StateRunning, got.State, "the worker's record, not the relayed one")
	require.Greater(t, loadRev, rev, "the revision to write over is the relayed record's")

	// The delivery's lease (its last write's revision) still holds: its
	// final write replaces the relayed record.
	three := 3
	st.State, st.ExitCode = messages.StateFailed, &three
	_, err = store.CAS(ctx, messages.StateRunning, &st, rev)
	require.NoError(t, err, "not fenced by a record no worker wrote")
	got, _, err = store.Load(ctx, "r1")
	require.NoError(t, err)
	require.Equal(t, messages.StateFailed, got.State)
	e, err := kv.Get(ctx, "r1")
	require.NoError(t, err)
	require.Contains(t, string(e.Value()), `"failed"`)

	// A run whose only record was relayed has none; a claim writes over it.
	relay("r2", messages.RunState{Version: messages.StateVersion, ID: "r2", State: messages.StateSucceeded, ExitCode: &zero})
	_, rev, err = store.Load(ctx, "r2")
	require.True(t, runstate.IsNotFound(err), "%v", err)
	require.NotZero(t, rev)
	st = messages.RunState{Version: messages.StateVersion, ID: "r2", State: messages.StateQueued}
	_, err = store.CAS(ctx, messages.StateNone, &st, 0)
	require.NoError(t, err, "a claim against no record is not fenced by a relayed one")
	got, _, err = store.Load(ctx, "r2")
	require.NoError(t, err)
	require.Equal(t, messages.StateQueued, got.State)
}
