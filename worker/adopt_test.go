package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/runstate"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// adoptRig is a server, one fake engine and one state directory shared by
// the workers a test starts in turn, as a worker and its successor on one
// host share them.
type adoptRig struct {
	bundle testBundle
	dir    string
	bridge string
}

func newAdoptRig(t *testing.T) *adoptRig {
	s := workertest.StartServer(t)
	nc := workertest.Connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return &adoptRig{bundle: testBundle{nc: nc, js: js, rt: workertest.NewTestRuntime(t)},
		dir: workertest.StateDir(t), bridge: workertest.BridgeFile(t)}
}

// start starts worker id on the rig; a cleanup stops it (a no-op once it
// left or stopped).
func (r *adoptRig) start(t *testing.T, id string) *worker.Worker {
	t.Helper()
	w, err := worker.New(r.bundle.nc, worker.Config{StateDir: r.dir, BridgePath: r.bridge, ID: id, Runtime: r.bundle.rt,
		Concurrency: 4, FetchWait: time.Second, Provision: worker.ProvisionConfig{AckWait: 3 * time.Second}})
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	return w
}

// adoptedEvent returns the run's adopted event, failing when it has none
// or more than one.
func adoptedEvent(t *testing.T, evs []jetstream.Msg) messages.Event {
	t.Helper()
	var found []messages.Event
	for _, m := range evs {
		if m.Subject() == messages.SubjectEvents(m.Headers().Get(messages.HeaderRunID), messages.EventAdopted) {
			var ev messages.Event
			require.NoError(t, json.Unmarshal(m.Data(), &ev))
			found = append(found, ev)
		}
	}
	require.Len(t, found, 1, "one adopted event")
	return found[0]
}

// TestLeaveAndAdopt: a worker stopped for an upgrade (Leave) leaves its
// runs running; its successor on the same engine adopts them. Each run
// ends once, in attempt 1, its container never started again, its output
// whole and published once (what it wrote while no worker watched it
// included), its record saying it was adopted and from whom. With wait,
// the successor starts after the request's ack wait passed: the
// redelivered request finds the run adopted and is left to it.
func TestLeaveAndAdopt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		wait time.Duration
	}{{"at once", 0}, {"after the ack wait", 4 * time.Second}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rig := newAdoptRig(t)
			b := &rig.bundle
			w1 := rig.start(t, "w1")
			var ids []string
			for i := range 3 {
				id := fmt.Sprintf("adopt-%d-%d", i, time.Now().UnixNano())
				ids = append(ids, id)
				b.submit(t, messages.RunRequest{ID: id, Profile: "shell",
					Prompt: "out a1;err e1;sleep 1500ms;out a2;err e2;sleep " + (tc.wait + 2*time.Second).String() + ";out a3;err e3"})
			}
			require.Eventually(t, func() bool {
				for _, id := range ids {
					if st, ok := b.state(t, id); !ok || st.State != messages.StateRunning || output(b.events(t, id), messages.StreamStdout) != "a1\n" {
						return false
					}
				}
				return true
			}, 15*time.Second, 20*time.Millisecond, "the runs start and publish their first line")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, w1.Leave(ctx))
			require.Equal(t, 3, b.rt.Live(), "the runs' containers run on")
			time.Sleep(tc.wait)
			rig.start(t, "w2")
			for _, id := range ids {
				st := b.waitFinal(t, id)
				require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
				require.Equal(t, 1, st.Attempts)
				require.Equal(t, 1, st.Adoptions)
				require.Equal(t, "w2", st.Worker)
				evs := b.events(t, id)
				require.Equal(t, "a1\na2\na3\n", output(evs, messages.StreamStdout), "stdout whole, once")
				require.Equal(t, "e1\ne2\ne3\n", output(evs, messages.StreamStderr), "stderr whole, once")
				ev := adoptedEvent(t, evs)
				require.Equal(t, "w1", ev.AdoptedFrom)
				require.Equal(t, 1, ev.Attempt)
			}
			require.Len(t, b.rt.Starts(), 3, "no run's container was started again")
			require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamRuns) == 0 }, 10*time.Second, 20*time.Millisecond,
				"the adopter acknowledged every request on its lease")
		})
	}
}

// TestWhileNoWorkerHoldsTheRun: what reaches a run while its worker is
// gone is carried out once a successor finds it. A run whose timeout
// passed meanwhile is adopted and times out at once, in its first
// attempt (its deadline counts from its start, not from the adoption); a
// run a cancel finalised meanwhile (answered by a worker on another
// engine) has its container removed at once, its request acknowledged.
func TestWhileNoWorkerHoldsTheRun(t *testing.T) {
	t.Parallel()
	rig := newAdoptRig(t)
	b := &rig.bundle
	w1 := rig.start(t, "w1")
	late, cancelled := "late-"+ulidLike(), "cancelled-"+ulidLike()
	b.submit(t, messages.RunRequest{ID: late, Profile: "shell", Prompt: "out started;sleep 1h", Timeout: messages.Duration(2 * time.Second)})
	b.submit(t, messages.RunRequest{ID: cancelled, Profile: "shell", Prompt: "out started;sleep 1h"})
	for _, id := range []string{late, cancelled} {
		require.Eventually(t, func() bool { st, ok := b.state(t, id); return ok && st.State == messages.StateRunning },
			10*time.Second, 20*time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, w1.Leave(ctx))

	// A worker on another engine answers the cancel: the run is recorded
	// cancelled, its container (on the first engine) left as it is.
	other := workertest.NewTestRuntime(t)
	w3, err := worker.New(b.nc, worker.Config{StateDir: workertest.StateDir(t), BridgePath: rig.bridge, ID: "w3", Runtime: other,
		Concurrency: 1, FetchWait: time.Second, Provision: worker.ProvisionConfig{AckWait: 3 * time.Second}})
	require.NoError(t, err)
	require.NoError(t, w3.Start(context.Background()))
	t.Cleanup(func() { _ = w3.Stop(context.Background()) })
	resp, err := b.nc.Request(messages.SubjectCancel(cancelled), nil, 10*time.Second)
	require.NoError(t, err)
	var reply messages.CancelReply
	require.NoError(t, json.Unmarshal(resp.Data, &reply))
	require.Equal(t, messages.StateCancelled, reply.State, reply.Message)
	time.Sleep(2500 * time.Millisecond) // the other run's timeout passes

	rig.start(t, "w2")
	st := b.waitFinal(t, late)
	require.Equal(t, messages.StateTimedOut, st.State, st.Reason)
	require.Equal(t, 1, st.Attempts)
	require.Equal(t, 1, st.Adoptions)
	require.Equal(t, "w2", st.Worker)
	require.Eventually(t, func() bool { return b.rt.Live() == 0 }, 10*time.Second, 20*time.Millisecond,
		"the timed-out run's container is stopped, the cancelled run's removed")
	st = b.waitFinal(t, cancelled)
	require.Equal(t, messages.StateCancelled, st.State)
	require.Equal(t, 0, st.Adoptions)
	require.Len(t, b.rt.Starts(), 2, "no run's container was started again")
	require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamRuns) == 0 }, 20*time.Second, 50*time.Millisecond,
		"both requests are acknowledged")
}

// ulidLike returns a fresh, unique token for a run id.
func ulidLike() string { return strconv.FormatInt(time.Now().UnixNano(), 36) }

// TestSuccessorsRace: two workers start on the engine of a worker that
// left three runs: each run is adopted exactly once (one adopted event,
// adoptions 1), by one of them, and ends once; and a run the first of
// them started itself meanwhile is never touched by the other, whose
// reconciler passes while it runs.
func TestSuccessorsRace(t *testing.T) {
	t.Parallel()
	rig := newAdoptRig(t)
	b := &rig.bundle
	w1 := rig.start(t, "w1")
	var ids []string
	for i := range 3 {
		id := fmt.Sprintf("race-%d-%s", i, ulidLike())
		ids = append(ids, id)
		b.submit(t, messages.RunRequest{ID: id, Profile: "shell", Prompt: "out a;sleep 2s;out b"})
	}
	for _, id := range ids {
		require.Eventually(t, func() bool { st, ok := b.state(t, id); return ok && st.State == messages.StateRunning },
			10*time.Second, 20*time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, w1.Leave(ctx))
	done := make(chan struct{})
	go func() { defer close(done); rig.start(t, "w3") }()
	rig.start(t, "w2")
	<-done
	own := "own-" + ulidLike()
	// It lasts past both workers' second pass (messages.WorkerTTL + 2 s
	// after their start), where each sees the other's run.
	b.submit(t, messages.RunRequest{ID: own, Profile: "shell", Prompt: "out mine;sleep " + (messages.WorkerTTL + 4*time.Second).String()})
	for _, id := range ids {
		st := b.waitFinal(t, id)
		require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
		require.Equal(t, 1, st.Attempts)
		require.Equal(t, 1, st.Adoptions)
		require.Contains(t, []string{"w2", "w3"}, st.Worker)
		evs := b.events(t, id)
		adoptedEvent(t, evs)
		require.Equal(t, "a\nb\n", output(evs, messages.StreamStdout))
	}
	var st messages.RunState
	require.Eventually(t, func() bool { var ok bool; st, ok = b.state(t, own); return ok && st.State.Final() },
		60*time.Second, 50*time.Millisecond)
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.Equal(t, 0, st.Adoptions, "a live worker's run is never adopted")
	require.Len(t, b.rt.Starts(), 4)
}

// TestLiveWorkerWithoutHeartbeatKeepsItsRun: a worker whose heartbeat
// key is gone (expired while its writes failed, say) but which is alive
// and still holds its run is never adopted from: a successor starting on
// its engine asks the holder before it fences the record. The run ends
// once, held by its worker throughout, its output published once.
func TestLiveWorkerWithoutHeartbeatKeepsItsRun(t *testing.T) {
	t.Parallel()
	rig := newAdoptRig(t)
	b := &rig.bundle
	rig.start(t, "w1")
	id := "alive-" + ulidLike()
	b.submit(t, messages.RunRequest{ID: id, Profile: "shell", Prompt: "out a;sleep 2s;out b;out c;out d;sleep 500ms;out e"})
	require.Eventually(t, func() bool {
		st, ok := b.state(t, id)
		return ok && st.State == messages.StateRunning && output(b.events(t, id), messages.StreamStdout) == "a\n"
	}, 10*time.Second, 20*time.Millisecond)
	kv, err := b.js.KeyValue(context.Background(), messages.BucketWorkers)
	require.NoError(t, err)
	require.NoError(t, kv.Delete(context.Background(), "w1"), "w1's heartbeat key expires; w1 lives on")
	rig.start(t, "w2")
	st := b.waitFinal(t, id)
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.Equal(t, "a\nb\nc\nd\ne\n", output(b.events(t, id), messages.StreamStdout), "stdout whole, once")
	require.Equal(t, 0, st.Adoptions, "a live worker's run is never adopted")
	require.Equal(t, "w1", st.Worker)
	require.Len(t, b.rt.Starts(), 1)
}

// TestFencedWorkerLeavesTheAdoptedContainer: a worker that finds, as it
// records its run's end, that a successor adopted the run meanwhile (it
// was cut off: its heartbeat expired, it could not answer) leaves the
// container and the run directory it mounts to the adopter, which
// concludes the run from them: it neither removes them nor acks.
func TestFencedWorkerLeavesTheAdoptedContainer(t *testing.T) {
	t.Parallel()
	rig := newAdoptRig(t)
	b := &rig.bundle
	w1 := rig.start(t, "w1")
	id := "fenced-" + ulidLike()
	b.submit(t, messages.RunRequest{ID: id, Profile: "shell", Prompt: "out a;sleep 1500ms;out b"})
	require.Eventually(t, func() bool { st, ok := b.state(t, id); return ok && st.State == messages.StateRunning },
		10*time.Second, 20*time.Millisecond)
	// The adopter's fence, as Runner.Adopt writes it.
	kv, err := b.js.KeyValue(context.Background(), messages.BucketRuns)
	require.NoError(t, err)
	store := runstate.NewStore(kv, b.js, "w9", zerolog.Nop())
	st, rev, err := store.Load(context.Background(), id)
	require.NoError(t, err)
	st.Worker, st.Adoptions = "w9", st.Adoptions+1
	_, err = store.CAS(context.Background(), messages.StateRunning, &st, rev)
	require.NoError(t, err)
	var runDir string
	for _, m := range b.rt.Starts()[0].Mounts {
		if m.Target == messages.ContainerRunDir {
			runDir = m.Source
		}
	}
	require.NotEmpty(t, runDir)

	require.Eventually(t, func() bool { return runsInFlight(w1) == 0 }, 10*time.Second, 20*time.Millisecond,
		"w1's delivery ends once the container exits")
	require.Equal(t, 1, b.rt.Live(), "the adopter's container is left to it")
	require.DirExists(t, runDir, "the run directory the container mounts is left to the adopter")
	got, _ := b.state(t, id)
	require.Equal(t, messages.StateRunning, got.State)
	require.Equal(t, "w9", got.Worker)
	require.Equal(t, uint64(1), b.streamMsgs(t, messages.StreamRuns), "the request is the adopter's to ack")
	require.NoError(t, b.rt.Remove(context.Background(), st.ContainerID))
}
