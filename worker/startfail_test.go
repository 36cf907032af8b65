package worker_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// listFails is a runtime whose engine cannot list its containers.
type listFails struct{ jail.Runtime }

func (listFails) ListManaged(context.Context) ([]jail.ManagedContainer, error) {
	return nil, errors.New("engine says no")
}

// TestFailedStartLeavesNothing: a Start that fails after its first parts
// started (here the reconciler's first pass, after the worker made its
// state directory and wrote its heartbeat) stops them again, in reverse:
// the state directory it made is gone and its key in the workers bucket
// deleted, so peers do not take a worker that never ran for alive; Stop
// then has nothing to do.
func TestFailedStartLeavesNothing(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	nc := workertest.Connect(t, s)
	root := workertest.StateDir(t)
	w, err := worker.New(nc, worker.Config{ID: "fails", StateRoot: root, BridgePath: workertest.BridgeFile(t),
		Runtime: listFails{workertest.NewTestRuntime(t)}})
	require.NoError(t, err)
	require.ErrorContains(t, w.Start(context.Background()), "worker: reconcile containers: engine says no")

	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	require.Empty(t, entries, "the state directory Start made is removed")
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.KeyValue(context.Background(), messages.BucketWorkers)
	require.NoError(t, err)
	_, err = kv.Get(context.Background(), "fails")
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "its heartbeat key is deleted")
	require.False(t, w.Ready())
	require.NoError(t, w.Stop(context.Background()))
}
