package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
)

// TestAdoptOnLastDelivery: a run on its last delivery (MaxDeliver) whose
// worker left (or died), adopted after the request's ack wait passed,
// ends as it would have. The server drops the request from the
// consumer's pending set at MaxDeliver (the lease's ack is then a no-op):
// the dead-letterer leaves a run that may yet be adopted, or is held live,
// to its holder instead of failing it ("delivered 1 times without an
// outcome", before), and the adopter removes the request itself.
func TestAdoptOnLastDelivery(t *testing.T) {
	t.Parallel()
	rig := newAdoptRig(t)
	b := &rig.bundle
	start := func(id string) *worker.Worker {
		w, err := worker.New(b.nc, worker.Config{StateDir: rig.dir, BridgePath: rig.bridge, ID: id, Runtime: b.rt,
			Concurrency: 4, FetchWait: time.Second, Provision: worker.ProvisionConfig{AckWait: 3 * time.Second, MaxDeliver: 1}})
		require.NoError(t, err)
		require.NoError(t, w.Start(context.Background()))
		t.Cleanup(func() { _ = w.Stop(context.Background()) })
		return w
	}
	w1 := start("w1")
	id := "last-" + ulidLike()
	b.submit(t, messages.RunRequest{ID: id, Profile: "shell", Prompt: "out a;sleep 8s;out b"})
	require.Eventually(t, func() bool { st, ok := b.state(t, id); return ok && st.State == messages.StateRunning },
		10*time.Second, 20*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, w1.Leave(ctx))
	time.Sleep(4500 * time.Millisecond)
	start("w2")
	st := b.waitFinal(t, id)
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.Equal(t, 1, st.Adoptions)
	require.Equal(t, "a\nb\n", output(b.events(t, id), messages.StreamStdout))
	require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamRuns) == 0 }, 10*time.Second, 50*time.Millisecond,
		"the adopter removed the exhausted request")
	require.Equal(t, uint64(0), b.streamMsgs(t, messages.StreamFailed), "no dead letter")
}
