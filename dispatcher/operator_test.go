package dispatcher

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
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

// startWorker runs a real worker with a fake runtime on b's server until the
// test ends (its log goes where workertest.Logger says). Its shell profile
// has coordination off: these tests are about the client side, and a replay
// right after the failure meets the failed delivery's coordination session
// and run directory, which outlive its request (a worker issue).
func (b *testBundle) startWorker(t *testing.T, rt *workertest.Runtime, concurrency int) *worker.Worker {
	t.Helper()
	shell, off := profile.ShellProfile(), false
	shell.Coordination = &off
	log := workertest.Logger(t)
	w, err := worker.New(b.nc, worker.Config{ID: "dispatcher-test", Runtime: rt, Concurrency: concurrency, FetchWait: time.Second,
		Profiles: profile.Profiles{"shell": shell}, Logger: &log, StateDir: workertest.StateDir(t), BridgePath: workertest.BridgeFile(t)})
	require.NoError(t, err)
	require.NoError(t, w.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	return w
}

// failFirst is a fake container behaviour: the first container of each run
// exits 3, later ones run the prompt as a workertest script.
func failFirst() func(jail.ContainerSpec) (workertest.Behaviour, error) {
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
	)
	return func(spec jail.ContainerSpec) (workertest.Behaviour, error) {
		id := spec.Labels[jail.LabelRunID]
		mu.Lock()
		first := !seen[id]
		seen[id] = true
		mu.Unlock()
		if first {
			return func(context.Context, jail.ContainerSpec, jail.OutputFunc) jail.ExitStatus {
				return jail.ExitStatus{Code: 3}
			}, nil
		}
		return workertest.ScriptBehaviour(spec)
	}
}

// putState writes st under its id, as a worker would.
func (b *testBundle) putState(t *testing.T, st messages.RunState) {
	t.Helper()
	kv, err := b.js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	st.Version = messages.StateVersion
	if st.Worker == "" {
		st.Worker = "w1" // publishDeadLetter's
	}
	data, err := json.Marshal(st)
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), st.ID, data)
	require.NoError(t, err)
}

// publishDeadLetter publishes a dead letter as a worker does.
func (b *testBundle) publishDeadLetter(t *testing.T, pool, id string, body string, exitCode int) uint64 {
	t.Helper()
	m := nats.NewMsg(messages.SubjectFailed(pool, id))
	m.Data = []byte(body)
	m.Header.Set(messages.HeaderRunID, id)
	m.Header.Set(messages.HeaderState, string(messages.StateFailed))
	m.Header.Set(messages.HeaderError, "exit code "+strconv.Itoa(exitCode))
	m.Header.Set(messages.HeaderAttempts, "2")
	m.Header.Set(messages.HeaderWorker, "w1")
	m.Header.Set(messages.HeaderExitCode, strconv.Itoa(exitCode))
	ack, err := b.js.PublishMsg(t.Context(), m)
	require.NoError(t, err)
	return ack.Sequence
}

func TestCancel(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.startWorker(t, workertest.NewTestRuntime(t), 1)
	ctx := t.Context()

	running, err := b.d.Submit(ctx, messages.RunRequest{Profile: "shell", Prompt: "sleep 1m"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := b.d.Status(ctx, running)
		return err == nil && st.State == messages.StateRunning
	}, 10*time.Second, 10*time.Millisecond)
	// The only slot is taken: this one stays queued.
	queued, err := b.d.Submit(ctx, messages.RunRequest{Profile: "shell", Prompt: "out never"})
	require.NoError(t, err)

	r, err := b.d.Cancel(ctx, queued)
	require.NoError(t, err)
	require.Equal(t, messages.CancelQueued, r.Result)
	require.Equal(t, messages.StateCancelled, r.State)
	require.Equal(t, queued, r.RunID)

	r, err = b.d.Cancel(ctx, running)
	require.NoError(t, err)
	require.Equal(t, messages.CancelStopping, r.Result)
	require.Equal(t, "dispatcher-test", r.Worker)
	st, err := b.d.Wait(ctx, running)
	require.NoError(t, err)
	require.Equal(t, messages.StateCancelled, st.State)
	require.Equal(t, 143, *st.ExitCode)

	// The queued run's request is delivered now, and skipped.
	require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamRuns) == 0 }, 10*time.Second, 10*time.Millisecond)
	st, err = b.d.Status(ctx, queued)
	require.NoError(t, err)
	require.Equal(t, messages.StateCancelled, st.State)
	require.Nil(t, st.ExitCode, "it never ran")

	r, err = b.d.Cancel(ctx, queued)
	require.NoError(t, err)
	require.Equal(t, messages.CancelAlreadyFinal, r.Result)
	require.Contains(t, r.Message, "already cancelled")

	_, err = b.d.Cancel(ctx, "a.b")
	require.ErrorIs(t, err, messages.ErrInvalidToken)
}

func TestCancelNoWorker(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := b.d.Cancel(t.Context(), "r1")
	require.ErrorIs(t, err, ErrNoWorker)
}

func TestCancelErrorReply(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	// A worker that answers with an error result.
	sub, err := b.nc.Subscribe(messages.SubjectCancel("r1"), func(m *nats.Msg) {
		data, _ := json.Marshal(messages.CancelReply{RunID: "r1", Result: messages.CancelError, Message: "read run state: boom"})
		_ = m.Respond(data)
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	r, err := b.d.Cancel(t.Context(), "r1")
	require.ErrorIs(t, err, ErrCancelFailed)
	require.ErrorContains(t, err, "boom")
	require.Equal(t, messages.CancelError, r.Result)
}

func TestFailed(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := t.Context()

	dls, err := b.d.Failed(ctx, "")
	require.NoError(t, err)
	require.Empty(t, dls)

	s1 := b.publishDeadLetter(t, "default", "r1", `{"id":"r1","profile":"shell"}`, 3)
	s2 := b.publishDeadLetter(t, "gpu", "r2", `{"id":"r2","profile":"shell","pool":"gpu"}`, 4)
	s3 := b.publishDeadLetter(t, "default", "r1", `{"id":"r1","profile":"shell"}`, 5)
	// Not a dead letter: no headers at all, a body that is not JSON.
	_, err = b.js.Publish(ctx, messages.SubjectFailed("default", "raw"), []byte("not json"))
	require.NoError(t, err)

	dls, err = b.d.Failed(ctx, "")
	require.NoError(t, err)
	require.Len(t, dls, 4)
	require.Equal(t, []uint64{s1, s2, s3}, []uint64{dls[0].Sequence, dls[1].Sequence, dls[2].Sequence})
	d := dls[0]
	require.Equal(t, "default", d.Pool)
	require.Equal(t, "r1", d.RunID)
	require.Equal(t, messages.SubjectFailed("default", "r1"), d.Subject)
	require.Equal(t, messages.StateFailed, d.State)
	require.Equal(t, "exit code 3", d.Reason)
	require.Equal(t, 2, d.Attempts)
	require.Equal(t, 3, *d.ExitCode)
	require.Equal(t, "w1", d.Worker)
	require.JSONEq(t, `{"id":"r1","profile":"shell"}`, string(d.Request))
	require.False(t, d.Time.IsZero())
	require.Nil(t, dls[3].ExitCode)
	require.Equal(t, "not json", string(dls[3].Request))

	dls, err = b.d.Failed(ctx, "gpu")
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, "r2", dls[0].RunID)

	last, err := b.d.LastDeadLetter(ctx, "r1")
	require.NoError(t, err)
	require.Equal(t, s3, last.Sequence)
	require.Equal(t, 5, *last.ExitCode)

	_, err = b.d.LastDeadLetter(ctx, "nope")
	require.ErrorIs(t, err, ErrNoDeadLetter)
	_, err = b.d.Failed(ctx, "a.b")
	require.ErrorIs(t, err, messages.ErrInvalidToken)
}

func TestFailedNotProvisioned(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noProvision: true})
	_, err := b.d.Failed(t.Context(), "")
	require.ErrorIs(t, err, ErrNotProvisioned)
	_, err = b.d.Replay(t.Context(), "r1")
	require.ErrorIs(t, err, ErrNotProvisioned)
}

// A failed run is replayed from its dead letter, runs anew under its id,
// and can be followed from the replay on; a succeeded one is refused.
func TestReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	rt := workertest.NewTestRuntime(t)
	rt.Behave = failFirst()
	b.startWorker(t, rt, 2)
	ctx := t.Context()

	id, err := b.d.Submit(ctx, messages.RunRequest{Profile: "shell", Prompt: "out replayed"})
	require.NoError(t, err)
	st, err := b.d.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, messages.StateFailed, st.State)
	first := st.StreamSeq
	// The failed delivery removes its container after its request left the
	// stream; a replay that comes first would find the container name taken
	// and be retried (attempts 2).
	require.Eventually(t, func() bool { return rt.Live() == 0 }, 5*time.Second, 10*time.Millisecond)

	r, err := b.d.Replay(ctx, id)
	require.NoError(t, err)
	require.Equal(t, id, r.RunID)
	require.Equal(t, "default", r.Pool)
	require.False(t, r.Duplicate)
	require.NotEqual(t, first, r.Sequence)
	dl, err := b.d.LastDeadLetter(ctx, id)
	require.NoError(t, err)
	require.Equal(t, dl.Sequence, r.DeadLetter.Sequence)

	var got []WatchEvent
	fin, err := b.d.WatchReplay(ctx, r, func(ev WatchEvent) error {
		got = append(got, ev)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, messages.StateSucceeded, fin.State, "%+v", fin)
	// Only the replay's events: started, its output, finished.
	require.Len(t, got, 3, "%+v", got)
	require.Equal(t, messages.EventStarted, got[0].Type)
	require.Equal(t, "replayed\n", string(got[1].Data))

	st, err = b.d.Status(ctx, id)
	require.NoError(t, err)
	require.Equal(t, messages.StateSucceeded, st.State)
	require.Equal(t, 1, st.Replays)
	require.Equal(t, 1, st.Attempts)
	require.Equal(t, r.Sequence, st.StreamSeq)

	// Watch shows the whole history, and ends with the replay's outcome.
	var finished []messages.State
	fin, err = b.d.Watch(ctx, id, func(ev WatchEvent) error {
		if ev.Type == messages.EventFinished {
			finished = append(finished, ev.Event.State)
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, messages.StateSucceeded, fin.State)
	require.Equal(t, []messages.State{messages.StateFailed, messages.StateSucceeded}, finished)

	_, err = b.d.Replay(ctx, id)
	require.ErrorIs(t, err, ErrReplayRefused)
	require.ErrorContains(t, err, "already succeeded")

	_, err = b.d.Replay(ctx, "never-failed")
	require.ErrorIs(t, err, ErrNoDeadLetter)
}

// Replaying one dead letter twice publishes it once, and a first replay is
// never deduplicated against the original submit (same run id).
func TestReplayDeduplicated(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}) // no worker: the requests stay on the stream
	ctx := t.Context()

	id, err := b.d.Submit(ctx, messages.RunRequest{ID: "dup", Profile: "shell", Prompt: "exit 3"})
	require.NoError(t, err)
	b.putState(t, messages.RunState{ID: id, State: messages.StateFailed, StreamSeq: 1, Pool: "default"})
	seq := b.publishDeadLetter(t, "default", id, `{"id":"dup","profile":"shell","prompt":"exit 3"}`, 3)

	r1, err := b.d.Replay(ctx, id)
	require.NoError(t, err)
	require.False(t, r1.Duplicate, "the replay is not the submit's duplicate")
	r2, err := b.d.Replay(ctx, id)
	require.NoError(t, err)
	require.True(t, r2.Duplicate)
	require.Equal(t, r1.Sequence, r2.Sequence)
	require.Equal(t, uint64(2), b.streamMsgs(t, messages.StreamRuns), "the submit and one replay")

	runs, err := b.js.Stream(ctx, messages.StreamRuns)
	require.NoError(t, err)
	m, err := runs.GetMsg(ctx, r1.Sequence)
	require.NoError(t, err)
	require.Equal(t, ReplayMsgID(id, seq), m.Header.Get(jetstream.MsgIDHeader))
	require.Equal(t, `{"id":"dup","profile":"shell","prompt":"exit 3"}`, string(m.Data), "the body unchanged")
	require.Equal(t, messages.SubjectReplay("default"), m.Subject, "on the operator's replay subject")
}

// A replay sent on seeing an unsuccessful final state waits for the dead
// letter the worker stores just after it, for every such state (stalled
// included): it gives up only after deadLetterDelay, and takes a dead letter
// that comes meanwhile.
func TestReplayWaitsForTheDeadLetter(t *testing.T) {
	t.Parallel()
	for _, s := range []messages.State{messages.StateFailed, messages.StateTimedOut, messages.StateStalled} {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{}) // no worker: the replay stays on the stream
			id := "late-" + strings.ReplaceAll(string(s), "_", "-")
			b.putState(t, messages.RunState{ID: id, State: s, StreamSeq: 1, Pool: "default"})
			start := time.Now()
			_, err := b.d.Replay(t.Context(), id)
			require.ErrorIs(t, err, ErrNoDeadLetter)
			require.GreaterOrEqual(t, time.Since(start), deadLetterDelay, "the replay of a %s run did not wait for its dead letter", s)

			type result struct {
				r   Replayed
				err error
			}
			done := make(chan result, 1)
			go func() {
				r, err := b.d.Replay(t.Context(), id)
				done <- result{r, err}
			}()
			time.Sleep(deadLetterDelay / 4) // the dead letter comes during the wait
			seq := b.publishDeadLetter(t, "default", id, `{"id":"`+id+`","profile":"shell","prompt":"exit 3"}`, 3)
			res := <-done
			require.NoError(t, res.err)
			require.Equal(t, seq, res.r.DeadLetter.Sequence)
		})
	}
}

func TestReplayRefusesUnfinished(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.publishDeadLetter(t, "default", "busy", `{"id":"busy","profile":"shell"}`, 3)
	for _, s := range []messages.State{messages.StateQueued, messages.StateRunning} {
		b.putState(t, messages.RunState{ID: "busy", State: s, Pool: "default"})
		_, err := b.d.Replay(t.Context(), "busy")
		require.ErrorIs(t, err, ErrReplayRefused)
		require.ErrorContains(t, err, string(s))
	}
	require.Zero(t, b.streamMsgs(t, messages.StreamRuns))
}

// A replay the worker refuses (the run succeeded in between) ends
// WatchReplay with ErrReplayRefused instead of waiting forever.
func TestWatchReplayRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := t.Context()
	b.putState(t, messages.RunState{ID: "raced", State: messages.StateFailed, StreamSeq: 99, Pool: "default"})
	b.publishDeadLetter(t, "default", "raced", `{"id":"raced","profile":"shell"}`, 3)
	r, err := b.d.Replay(ctx, "raced")
	require.NoError(t, err)
	// Meanwhile the run succeeded through another request.
	b.putState(t, messages.RunState{ID: "raced", State: messages.StateSucceeded, StreamSeq: 100, Pool: "default"})
	b.startWorker(t, workertest.NewTestRuntime(t), 1)

	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = b.d.WatchReplay(wctx, r, nil)
	require.ErrorIs(t, err, ErrReplayRefused)
	require.ErrorContains(t, err, "duplicate request refused")
}
