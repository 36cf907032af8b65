package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

func (b *testBundle) cancel(t *testing.T, id string) messages.CancelReply {
	t.Helper()
	resp, err := b.nc.Request(messages.SubjectCancel(id), nil, 5*time.Second)
	require.NoError(t, err)
	var r messages.CancelReply
	require.NoError(t, json.Unmarshal(resp.Data, &r))
	return r
}

func TestCancelRunning(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.submit(t, messages.RunRequest{ID: "c1", Profile: "shell", Prompt: "out started; sleep 1h"})
	require.Eventually(t, func() bool { st, _ := b.state(t, "c1"); return st.State == messages.StateRunning }, 5*time.Second, 10*time.Millisecond)
	r := b.cancel(t, "c1")
	require.Equal(t, messages.CancelStopping, r.Result, r.Message)
	require.Equal(t, "w1", r.Worker)
	st := b.waitFinal(t, "c1")
	require.Equal(t, messages.StateCancelled, st.State)
	require.Equal(t, 143, *st.ExitCode)
	// Cancelled runs are removed from the queue and are not dead letters.
	require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamRuns) == 0 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, uint64(0), b.streamMsgs(t, messages.StreamFailed))
	require.Equal(t, messages.CancelAlreadyFinal, b.cancel(t, "c1").Result)
}

func TestCancelQueuedIsSkipped(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *worker.Config) { c.Concurrency = 1 })
	b.submit(t, messages.RunRequest{ID: "busy", Profile: "shell", Prompt: "sleep 800ms"})
	require.Eventually(t, func() bool { return len(b.rt.Starts()) == 1 }, 5*time.Second, 10*time.Millisecond)
	// Not yet seen by any worker: the only slot is busy.
	r := b.cancel(t, "later")
	require.Equal(t, messages.CancelQueued, r.Result, r.Message)
	b.submit(t, messages.RunRequest{ID: "later", Profile: "shell", Prompt: "out should-not-run"})
	require.Equal(t, messages.StateSucceeded, b.waitFinal(t, "busy").State)
	require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamRuns) == 0 }, 5*time.Second, 10*time.Millisecond)
	st, _ := b.state(t, "later")
	require.Equal(t, messages.StateCancelled, st.State)
	require.Len(t, b.rt.Starts(), 1, "the cancelled run never started")
}

func TestDuplicateOfSucceededRefusedVisibly(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.submit(t, messages.RunRequest{ID: "d1", Profile: "shell", Prompt: "out once"})
	b.waitFinal(t, "d1")
	// A second message for the run id, outside any duplicate window.
	b.publish(t, "default", `{"id":"d1","profile":"shell","prompt":"out twice"}`)
	require.Eventually(t, func() bool {
		for _, m := range b.events(t, "d1") {
			if m.Subject() == messages.SubjectEvents("d1", messages.EventDuplicate) {
				return true
			}
		}
		return false
	}, 5*time.Second, 20*time.Millisecond, "no duplicate event")
	require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamRuns) == 0 }, 5*time.Second, 10*time.Millisecond)
	require.Len(t, b.rt.Starts(), 1)
	st, _ := b.state(t, "d1")
	require.Equal(t, messages.StateSucceeded, st.State)
}

// Replaying a failed run's dead letter (its body published again) runs it
// anew; it is not swallowed as a duplicate.
func TestReplayOfFailedRunRuns(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.submit(t, messages.RunRequest{ID: "rp1", Profile: "shell", Prompt: "out hello; exit 1"})
	require.Equal(t, messages.StateFailed, b.waitFinal(t, "rp1").State)
	dl := b.deadLetter(t, "default", "rp1")
	b.publish(t, "default", string(dl.Data))
	require.Eventually(t, func() bool { return len(b.rt.Starts()) == 2 }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		st, _ := b.state(t, "rp1")
		return st.Replays == 1 && st.State.Final()
	}, 5*time.Second, 10*time.Millisecond)
	// Both failures are in the dead-letter stream, one per request message.
	require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamFailed) == 2 }, 5*time.Second, 10*time.Millisecond)
	// The replay's output is its own, not swallowed as a duplicate of the
	// first request's (same attempt number, same offsets).
	outputs := 0
	for _, m := range b.events(t, "rp1") {
		if m.Subject() == messages.SubjectEvents("rp1", messages.EventOutput) && string(m.Data()) == "hello\n" {
			outputs++
		}
	}
	require.Equal(t, 2, outputs)
}

// A request whose last delivery died with its worker (never acked) is
// moved to the dead-letter stream from the MaxDeliver advisory.
func TestMaxDeliverAdvisoryDeadLetters(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	nc := workertest.Connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	cons, err := worker.Provision(context.Background(), js, worker.ProvisionConfig{AckWait: 500 * time.Millisecond, MaxDeliver: 2})
	require.NoError(t, err)
	_, err = js.Publish(context.Background(), messages.SubjectRuns("default"), []byte(`{"id":"md1","profile":"shell"}`))
	require.NoError(t, err)
	// A "worker" that takes both deliveries and dies without an outcome.
	for range 2 {
		require.Eventually(t, func() bool {
			m, err := cons.Next(jetstream.FetchMaxWait(time.Second))
			return err == nil && m != nil
		}, 5*time.Second, 10*time.Millisecond)
	}
	rt := workertest.NewTestRuntime(t)
	w, err := worker.New(nc, worker.Config{StateDir: workertest.StateDir(t), BridgePath: workertest.BridgeFile(t), ID: "w9", Runtime: rt, FetchWait: time.Second,
		Provision: worker.ProvisionConfig{AckWait: 500 * time.Millisecond, MaxDeliver: 2}})
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	defer w.Stop(context.Background())
	b := &testBundle{nc: nc, js: js, rt: rt, w: w}
	st := b.waitFinal(t, "md1")
	require.Equal(t, messages.StateFailed, st.State)
	require.Contains(t, st.Reason, "MaxDeliver")
	dl := b.deadLetter(t, "default", "md1")
	require.Equal(t, `{"id":"md1","profile":"shell"}`, string(dl.Data))
	require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamRuns) == 0 }, 5*time.Second, 10*time.Millisecond)
	require.Empty(t, rt.Starts())
}

// A delivery whose lease is taken (the state changed under it) stops its
// container and records nothing.
func TestFencedDeliveryRecordsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.submit(t, messages.RunRequest{ID: "f1", Profile: "shell", Prompt: "sleep 1h"})
	require.Eventually(t, func() bool { st, _ := b.state(t, "f1"); return st.State == messages.StateRunning }, 5*time.Second, 10*time.Millisecond)
	// Another delivery claims the run: its write bumps the revision.
	kv, err := b.js.KeyValue(context.Background(), messages.BucketRuns)
	require.NoError(t, err)
	e, err := kv.Get(context.Background(), "f1")
	require.NoError(t, err)
	var st messages.RunState
	require.NoError(t, json.Unmarshal(e.Value(), &st))
	st.Worker, st.Attempts = "w-other", 2
	nb, _ := json.Marshal(st)
	_, err = kv.Update(context.Background(), "f1", nb, e.Revision())
	require.NoError(t, err)
	// The holder learns it lost the lease at its next write; trigger one by
	// timing the run out through a cancel-free path: stop via the runtime.
	cs, _ := b.rt.ListManaged(context.Background())
	require.Len(t, cs, 1)
	require.NoError(t, b.rt.Remove(context.Background(), cs[0].ID))
	// The delivery sees its container gone, finds the lease taken at its
	// write and gives the run up: its Handle returns.
	require.Eventually(t, func() bool { return runsInFlight(b.w) == 0 }, 10*time.Second, 10*time.Millisecond,
		"the fenced delivery never ended")
	// Its state writes wait for the server, so any write is visible now.
	got, _ := b.state(t, "f1")
	require.Equal(t, "w-other", got.Worker, "the fenced delivery overwrote the new holder's state")
	require.False(t, got.State.Final())
	// An ack is not waited for: the flush puts any ack it sent on the
	// server, which then removes the request from the work queue in the
	// background, well within the 300 ms watched here.
	require.NoError(t, b.nc.Flush())
	runs, err := b.js.Stream(context.Background(), messages.StreamRuns)
	require.NoError(t, err)
	require.Never(t, func() bool {
		info, err := runs.Info(context.Background())
		return err != nil || info.State.Msgs != 1
	}, 300*time.Millisecond, 20*time.Millisecond, "the fenced delivery acked a run it no longer holds (or the stream could not be read)")
}

// A replay still queued when its run is cancelled is skipped on arrival.
func TestCancelQueuedReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.submit(t, messages.RunRequest{ID: "cr1", Profile: "shell", Prompt: "exit 1"})
	require.Equal(t, messages.StateFailed, b.waitFinal(t, "cr1").State)
	r := b.cancel(t, "cr1")
	require.Equal(t, messages.CancelAlreadyFinal, r.Result)
	require.Contains(t, r.Message, "replay of it that is still queued will be skipped")
	dl := b.deadLetter(t, "default", "cr1")
	b.publish(t, "default", string(dl.Data))
	require.Eventually(t, func() bool {
		st, _ := b.state(t, "cr1")
		return st.State == messages.StateCancelled && st.Replays == 1
	}, 5*time.Second, 10*time.Millisecond)
	require.Len(t, b.rt.Starts(), 1, "the cancelled replay never started")
	// The next replay runs again: the cancel applied to one replay.
	b.publish(t, "default", string(dl.Data))
	require.Eventually(t, func() bool { return len(b.rt.Starts()) == 2 }, 5*time.Second, 10*time.Millisecond)
}

// A profile that asks for retries gets a failed agent tried again; without
// it, a non-zero exit is final at once.
func TestProfileRetriesFailedAgent(t *testing.T) {
	t.Parallel()
	ps, err := profile.ParseProfiles("p.toml", []byte("[profiles.retry]\nimage='i'\ncommand=['/bin/sh','-c','{prompt}']\nretries=1\nrequire_bridge=false\n"))
	require.NoError(t, err)
	var calls atomic.Int32
	b := setup(t, func(c *worker.Config) {
		c.Profiles = ps
		rt := workertest.NewTestRuntime(t)
		rt.Behave = func(spec jail.ContainerSpec) (workertest.Behaviour, error) {
			if spec.Labels[jail.LabelProfile] == "retry" && calls.Add(1) == 1 {
				return workertest.ScriptBehaviour(jail.ContainerSpec{Cmd: []string{"err flaky; exit 1"}})
			}
			return workertest.ScriptBehaviour(spec)
		}
		c.Runtime = rt
	})
	b.submit(t, messages.RunRequest{ID: "rt1", Profile: "retry", Prompt: "out ok"})
	st := b.waitFinal(t, "rt1")
	require.Equal(t, messages.StateSucceeded, st.State)
	require.Equal(t, 2, st.Attempts)

	b.submit(t, messages.RunRequest{ID: "rt2", Profile: "retry", Prompt: "exit 4"})
	st = b.waitFinal(t, "rt2")
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, 2, st.Attempts, "one retry, then final")
	require.Equal(t, 4, *st.ExitCode)
}

// A push consumer's deliver subject and a stream's RePublish are publishes
// by the server, checked against nobody's permissions: a reader could make
// the server deliver to jetcrew.cancel.<run> or jetcrew.ctl.stop.<run>.
// The workers answer requests, never what the server delivered or relayed
// there.
func TestCancelRefusesServerDeliveries(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.submit(t, messages.RunRequest{ID: "d1", Profile: "shell", Prompt: "sleep 1h"})
	require.Eventually(t, func() bool { st, _ := b.state(t, "d1"); return st.State == messages.StateRunning }, 5*time.Second, 10*time.Millisecond)
	ctx := t.Context()
	js, err := jetstream.New(b.nc)
	require.NoError(t, err)
	targets := []string{messages.SubjectCancel("d1"), messages.SubjectStopPrefix + ".d1"}
	// The server delivers to a subject only while someone subscribes to it
	// by its very name: so do we, and see every delivery arrive.
	arrived := make(chan *nats.Msg, 8)
	for _, subj := range targets {
		sub, err := b.nc.ChanSubscribe(subj, arrived)
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	require.NoError(t, b.nc.Flush())

	// A push consumer of a stream of someone's, delivering to each.
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "CONTROL", Subjects: []string{"control.in"}})
	require.NoError(t, err)
	_, err = js.Publish(ctx, "control.in", nil)
	require.NoError(t, err)
	for i, subj := range targets {
		_, err = js.CreateConsumer(ctx, "CONTROL", jetstream.ConsumerConfig{Name: fmt.Sprintf("deliver-%d", i), DeliverSubject: subj,
			AckPolicy: jetstream.AckNonePolicy})
		require.NoError(t, err)
	}
	// A stream republishing to each.
	for i, subj := range targets {
		src := fmt.Sprintf("relay.%d", i)
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: fmt.Sprintf("RELAY%d", i), Subjects: []string{src},
			RePublish: &jetstream.RePublish{Source: src, Destination: subj}})
		require.NoError(t, err)
		_, err = js.Publish(ctx, src, nil)
		require.NoError(t, err)
	}
	for range 4 {
		select {
		case <-arrived:
		case <-time.After(5 * time.Second):
			t.Fatal("a delivery did not arrive")
		}
	}
	require.Never(t, func() bool { st, _ := b.state(t, "d1"); return st.State != messages.StateRunning }, time.Second, 20*time.Millisecond,
		"a delivery cancelled or stopped the run")
	require.Equal(t, messages.CancelStopping, b.cancel(t, "d1").Result, "a request still does")
	require.Equal(t, messages.StateCancelled, b.waitFinal(t, "d1").State)
}
