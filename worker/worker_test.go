package worker_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

type testBundle struct {
	nc *nats.Conn
	js jetstream.JetStream
	rt *workertest.Runtime
	w  *worker.Worker
}

// setup starts a fresh server and a worker with a fake runtime. mod may
// change the config before the worker is created.
func setup(t *testing.T, mod func(*worker.Config)) *testBundle {
	t.Helper()
	s := workertest.StartServer(t)
	nc := workertest.Connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	rt := workertest.NewTestRuntime(t)
	cfg := worker.Config{StateDir: workertest.StateDir(t), BridgePath: workertest.BridgeFile(t), ID: "w1", Runtime: rt, Concurrency: 2, FetchWait: 2 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	w, err := worker.New(nc, cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	return &testBundle{nc: nc, js: js, rt: rt, w: w}
}

func (b *testBundle) publish(t *testing.T, pool string, body string) *jetstream.PubAck {
	t.Helper()
	ack, err := b.js.Publish(context.Background(), messages.SubjectRuns(pool), []byte(body))
	require.NoError(t, err)
	return ack
}

func (b *testBundle) submit(t *testing.T, req messages.RunRequest) {
	t.Helper()
	data, err := json.Marshal(req)
	require.NoError(t, err)
	_, err = b.js.Publish(context.Background(), messages.SubjectRuns(req.WithDefaults().Pool), data, jetstream.WithMsgID(req.ID))
	require.NoError(t, err)
}

func (b *testBundle) state(t *testing.T, id string) (messages.RunState, bool) {
	t.Helper()
	kv, err := b.js.KeyValue(context.Background(), messages.BucketRuns)
	require.NoError(t, err)
	e, err := kv.Get(context.Background(), id)
	if err != nil {
		return messages.RunState{}, false
	}
	var st messages.RunState
	require.NoError(t, json.Unmarshal(e.Value(), &st))
	return st, true
}

// waitFinal polls until run id reaches a final state and returns it.
func (b *testBundle) waitFinal(t *testing.T, id string) messages.RunState {
	t.Helper()
	var st messages.RunState
	require.Eventually(t, func() bool {
		var ok bool
		st, ok = b.state(t, id)
		return ok && st.State.Final()
	}, 20*time.Second, 20*time.Millisecond, "run %s never reached a final state", id)
	return st
}

// streamMsgs returns the number of messages left in a stream.
func (b *testBundle) streamMsgs(t *testing.T, name string) uint64 {
	t.Helper()
	s, err := b.js.Stream(context.Background(), name)
	require.NoError(t, err)
	info, err := s.Info(context.Background())
	require.NoError(t, err)
	return info.State.Msgs
}

// runsInFlight reads w's jetcrew_runs_in_flight gauge: the deliveries it
// is handling (their Handle has not returned). It is NaN when the gauge
// cannot be read.
func runsInFlight(w *worker.Worker) float64 {
	mfs, err := w.Registry().Gather()
	if err != nil {
		return math.NaN()
	}
	for _, mf := range mfs {
		if mf.GetName() == "jetcrew_runs_in_flight" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return math.NaN()
}

// events returns every event of a run in stream order.
func (b *testBundle) events(t *testing.T, id string) []jetstream.Msg {
	t.Helper()
	return workertest.Events(t, b.js, id)
}

func output(evs []jetstream.Msg, stream string) string {
	var sb strings.Builder
	for _, m := range evs {
		if strings.HasSuffix(m.Subject(), ".output") && m.Headers().Get(messages.HeaderStream) == stream {
			sb.Write(m.Data())
		}
	}
	return sb.String()
}

func TestRunSucceeds(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.submit(t, messages.RunRequest{ID: "ok1", Profile: "shell", Prompt: "out hello; err oops; exit 0", Labels: map[string]string{"k": "v"}})
	st := b.waitFinal(t, "ok1")
	require.Equal(t, messages.StateSucceeded, st.State)
	require.NotNil(t, st.ExitCode)
	require.Equal(t, 0, *st.ExitCode)
	require.Equal(t, 1, st.Attempts)
	require.Equal(t, "shell", st.Profile)
	require.Equal(t, "w1", st.Worker)
	require.Equal(t, "default", st.Pool)
	require.NotEmpty(t, st.ContainerID)
	require.Equal(t, map[string]string{"k": "v"}, st.Labels)
	require.False(t, st.StartedAt.IsZero())
	require.False(t, st.FinishedAt.IsZero())

	// The finished event follows the final state once the container is
	// removed.
	var evs []jetstream.Msg
	require.Eventually(t, func() bool {
		evs = b.events(t, "ok1")
		return len(evs) > 0 && evs[len(evs)-1].Subject() == messages.SubjectEvents("ok1", messages.EventFinished)
	}, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, "hello\n", output(evs, "stdout"))
	require.Equal(t, "oops\n", output(evs, "stderr"))
	require.True(t, strings.HasSuffix(evs[0].Subject(), ".started"))
	last := evs[len(evs)-1]
	require.Equal(t, messages.SubjectEvents("ok1", messages.EventFinished), last.Subject())
	var fin messages.Event
	require.NoError(t, json.Unmarshal(last.Data(), &fin))
	require.Equal(t, messages.StateSucceeded, fin.State)

	// Acked after the result was written: the work queue is empty, and the
	// container was removed.
	require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamRuns) == 0 }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return b.rt.Live() == 0 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, uint64(0), b.streamMsgs(t, messages.StreamFailed))

	spec := b.rt.Starts()[0]
	require.Regexp(t, `^jetcrew-ok1-[0-9]+-1$`, spec.Name, "run id, request sequence, delivery")
	require.Contains(t, spec.Env, "JETCREW_RUN_ID=ok1")
	require.Equal(t, "ok1", spec.Labels[jail.LabelRunID])
	require.Equal(t, "w1", spec.Labels[jail.LabelWorker])
}

// The ack comes only after the final state is recorded: whenever the
// request is gone from the work queue, the state is already final.
func TestAckAfterResultWritten(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for i := range 10 {
		b.submit(t, messages.RunRequest{ID: fmt.Sprintf("a%d", i), Profile: "shell", Prompt: "out x"})
	}
	require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamRuns) == 0 }, 20*time.Second, time.Millisecond)
	for i := range 10 {
		st, ok := b.state(t, fmt.Sprintf("a%d", i))
		require.True(t, ok)
		require.Equal(t, messages.StateSucceeded, st.State)
	}
}

func TestNonZeroExitFailsAndKeepsOutput(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.submit(t, messages.RunRequest{ID: "bad1", Profile: "shell", Prompt: "out partial; err broke; exit 3"})
	st := b.waitFinal(t, "bad1")
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, 3, *st.ExitCode)
	require.Equal(t, "exit code 3: broke", st.Reason)
	require.Equal(t, 1, st.Attempts, "a non-zero exit is not retried")
	evs := b.events(t, "bad1")
	require.Equal(t, "partial\n", output(evs, "stdout"))
	require.Equal(t, "broke\n", output(evs, "stderr"))
	// The request is not lost: it is in the dead-letter stream, as submitted.
	dl := b.deadLetter(t, "default", "bad1")
	require.Equal(t, "exit code 3: broke", dl.Header.Get(messages.HeaderError))
	require.Equal(t, "3", dl.Header.Get(messages.HeaderExitCode))
	require.Contains(t, string(dl.Data), `"prompt":"out partial; err broke; exit 3"`)
	require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamRuns) == 0 }, 5*time.Second, 10*time.Millisecond)
}

func (b *testBundle) deadLetter(t *testing.T, pool, id string) *jetstream.RawStreamMsg {
	t.Helper()
	s, err := b.js.Stream(context.Background(), messages.StreamFailed)
	require.NoError(t, err)
	var m *jetstream.RawStreamMsg
	require.Eventually(t, func() bool {
		m, err = s.GetLastMsgForSubject(context.Background(), messages.SubjectFailed(pool, id))
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	return m
}

func TestUnknownProfileFails(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.submit(t, messages.RunRequest{ID: "np1", Profile: "nope", Prompt: "out x"})
	st := b.waitFinal(t, "np1")
	require.Equal(t, messages.StateFailed, st.State)
	require.Contains(t, st.Reason, `unknown profile "nope"`)
	require.Nil(t, st.ExitCode)
	require.Empty(t, b.rt.Starts())
	dl := b.deadLetter(t, "default", "np1")
	require.Contains(t, dl.Header.Get(messages.HeaderError), "unknown profile")
}

// Invalid requests published by a raw client are recorded as failed with the
// reason, copied to the dead-letter stream byte for byte, and never crash
// the worker or vanish.
func TestInvalidRawRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	cases := []struct {
		body   string
		id     string // expected run id; "" means derived
		reason string
	}{
		{`not json`, "", "invalid run request"},
		{`{"id":"inv1","profile":"shell","prompt":"x","bogus":1}`, "inv1", `unknown field "bogus"`},
		{`{"id":"inv2","prompt":"x"}`, "inv2", "profile is required"},
		{`{"id":"bad.id","profile":"shell"}`, "", "id"},
		{`{"id":"inv3","profile":"shell","group":"a b"}`, "inv3", "group"},
		{`{"id":"inv4","profile":"shell","pool":"other"}`, "inv4", "pool"},
		{`{"id":"inv5","profile":"shell","env":{"JETCREW_RUN_ID":"x"}}`, "inv5", "reserved"},
		{`{"id":"inv6","profile":"shell","timeout":"forever"}`, "inv6", "invalid run request"},
		{`{"id":"inv7","profile":"shell","prompt":"` + strings.Repeat("x", messages.MaxRequestBytes) + `"}`, "inv7", "largest allowed"},
		{`{"id":"inv8","profile":"shell"} {"id":"x"}`, "", "after the JSON object"},
	}
	for _, c := range cases {
		ack := b.publish(t, "default", c.body)
		id := c.id
		if id == "" {
			id = b.derivedID(t, ack.Sequence)
		}
		st := b.waitFinal(t, id)
		require.Equal(t, messages.StateFailed, st.State, c.body)
		require.Contains(t, st.Reason, c.reason, c.body)
		dl := b.deadLetter(t, "default", id)
		require.Equal(t, c.body, string(dl.Data), "dead letter body is the request as submitted")
	}
	require.Empty(t, b.rt.Starts())
	require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamRuns) == 0 }, 5*time.Second, 10*time.Millisecond)
}

func (b *testBundle) derivedID(t *testing.T, seq uint64) string {
	t.Helper()
	// The derived id is a ULID from the message's stream timestamp and
	// sequence; find it among the states by sequence.
	kv, err := b.js.KeyValue(context.Background(), messages.BucketRuns)
	require.NoError(t, err)
	var found string
	require.Eventually(t, func() bool {
		lister, err := kv.ListKeys(context.Background())
		if err != nil {
			return false
		}
		for k := range lister.Keys() {
			if id, err := ulid.Parse(k); err == nil && binary.BigEndian.Uint64(id.Entropy()[2:]) == seq {
				found = k
			}
		}
		return found != ""
	}, 10*time.Second, 20*time.Millisecond)
	return found
}

// A request without an id gets one derived from the message, the same on
// every delivery.
func TestDerivedIDStableAcrossRedelivery(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := setup(t, func(c *worker.Config) {
		rt := workertest.NewTestRuntime(t)
		rt.Behave = func(spec jail.ContainerSpec) (workertest.Behaviour, error) {
			if calls.Add(1) == 1 {
				return nil, workertest.ErrTransient
			}
			return workertest.ScriptBehaviour(spec)
		}
		c.Runtime = rt
	})
	ack := b.publish(t, "default", `{"profile":"shell","prompt":"out hi"}`)
	id := b.derivedID(t, ack.Sequence)
	st := b.waitFinal(t, id)
	require.Equal(t, messages.StateSucceeded, st.State)
	require.Equal(t, 2, st.Attempts, "first start failed transiently, second succeeded under the same id")
}

// InProgress keeps a run that is longer than AckWait from being redelivered.
func TestInProgressKeepsLongRunAlive(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *worker.Config) {
		c.Provision.AckWait = time.Second
		c.InProgressInterval = 250 * time.Millisecond
	})
	b.submit(t, messages.RunRequest{ID: "long1", Profile: "shell", Prompt: "sleep 3500ms; out done"})
	st := b.waitFinal(t, "long1")
	require.Equal(t, messages.StateSucceeded, st.State)
	require.Equal(t, 1, st.Attempts)
	require.Len(t, b.rt.Starts(), 1, "no redelivery while the run was alive")
}

// A worker holds at most one request per free slot: with 2 slots busy, the
// other requests stay pending on the stream, not in the worker.
func TestOneMessagePerFreeSlot(t *testing.T) {
	t.Parallel()
	// Every run holds its slot until release is closed.
	release := make(chan struct{})
	b := setup(t, func(c *worker.Config) {
		c.Concurrency = 2
		c.Runtime.(*workertest.Runtime).Behave = func(jail.ContainerSpec) (workertest.Behaviour, error) {
			return func(ctx context.Context, _ jail.ContainerSpec, _ jail.OutputFunc) jail.ExitStatus {
				select {
				case <-release:
					return jail.ExitStatus{}
				case <-ctx.Done():
					return jail.ExitStatus{Code: 143}
				}
			}, nil
		}
	})
	for i := range 6 {
		b.submit(t, messages.RunRequest{ID: fmt.Sprintf("s%d", i), Profile: "shell"})
	}
	cons, err := b.js.Consumer(context.Background(), messages.StreamRuns, messages.ConsumerName("default"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(b.rt.Starts()) == 2 }, 5*time.Second, 10*time.Millisecond)
	// Both slots stay busy: a worker that pulled ahead of its free slots
	// would hold a third request within one pull's round trip, far less
	// than the 500 ms watched here.
	require.Never(t, func() bool {
		info, err := cons.Info(context.Background())
		return err != nil || info.NumAckPending > 2
	}, 500*time.Millisecond, 20*time.Millisecond, "worker holds more requests than free slots (or the consumer could not be read)")
	require.Len(t, b.rt.Starts(), 2)
	close(release)
	for i := range 6 {
		require.Equal(t, messages.StateSucceeded, b.waitFinal(t, fmt.Sprintf("s%d", i)).State)
	}
	require.Equal(t, 2, b.rt.MaxRunning())
}

// A redelivered or resubmitted request whose run is already final is acked
// without running again.
func TestFinalRunNotRunAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.submit(t, messages.RunRequest{ID: "once", Profile: "shell", Prompt: "out 1"})
	b.waitFinal(t, "once")
	// Resubmit after the duplicate window would let it through: publish
	// without a message id to simulate that.
	b.publish(t, "default", `{"id":"once","profile":"shell","prompt":"out 2"}`)
	require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamRuns) == 0 }, 5*time.Second, 10*time.Millisecond)
	require.Len(t, b.rt.Starts(), 1)
}

func TestTransientStartErrorRetriesThenDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *worker.Config) {
		rt := workertest.NewTestRuntime(t)
		rt.Behave = func(jail.ContainerSpec) (workertest.Behaviour, error) { return nil, workertest.ErrTransient }
		c.Runtime = rt
		c.Provision.MaxDeliver = 2
	})
	b.submit(t, messages.RunRequest{ID: "tr1", Profile: "shell"})
	st := b.waitFinal(t, "tr1")
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, 2, st.Attempts)
	require.Contains(t, st.Reason, "gave up after 2 attempts")
	b.deadLetter(t, "default", "tr1")
}

func TestPermanentStartErrorNotRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *worker.Config) {
		rt := workertest.NewTestRuntime(t)
		rt.Behave = func(jail.ContainerSpec) (workertest.Behaviour, error) {
			return nil, fmt.Errorf("image missing: %w", jail.ErrPermanent)
		}
		c.Runtime = rt
	})
	b.submit(t, messages.RunRequest{ID: "pe1", Profile: "shell"})
	st := b.waitFinal(t, "pe1")
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, 1, st.Attempts)
	require.Contains(t, st.Reason, "image missing")
}

func TestTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.submit(t, messages.RunRequest{ID: "to1", Profile: "shell", Prompt: "sleep 1m", Timeout: messages.Duration(300 * time.Millisecond)})
	st := b.waitFinal(t, "to1")
	require.Equal(t, messages.StateTimedOut, st.State)
	require.Equal(t, 143, *st.ExitCode)
	require.Contains(t, st.Reason, "timed out after 300ms")
}

func TestLargeOutputChunked(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *worker.Config) {
		rt := workertest.NewTestRuntime(t)
		rt.Behave = func(jail.ContainerSpec) (workertest.Behaviour, error) {
			return func(ctx context.Context, _ jail.ContainerSpec, out jail.OutputFunc) jail.ExitStatus {
				line := []byte(strings.Repeat("y", 200<<10) + "\n")
				out("stdout", line[:1000])
				out("stdout", line[1000:])
				out("stderr", []byte{0xff, 0xfe, '\n'})
				out("stdout", []byte("tail"))
				return jail.ExitStatus{}
			}, nil
		}
		c.Runtime = rt
	})
	b.submit(t, messages.RunRequest{ID: "big1", Profile: "shell"})
	st := b.waitFinal(t, "big1")
	require.Equal(t, messages.StateSucceeded, st.State)
	evs := b.events(t, "big1")
	require.Equal(t, strings.Repeat("y", 200<<10)+"\ntail", output(evs, "stdout"))
	require.Equal(t, string([]byte{0xff, 0xfe, '\n'}), output(evs, "stderr"))
	require.Equal(t, int64(200<<10+1+3+4), st.OutputBytes)
	var order []string
	for _, m := range evs {
		require.LessOrEqual(t, len(m.Data()), messages.MaxOutputChunk)
		if s := m.Headers().Get(messages.HeaderStream); s != "" && (len(order) == 0 || order[len(order)-1] != s) {
			order = append(order, s)
		}
	}
	require.Equal(t, []string{"stdout", "stderr", "stdout"}, order)
}

// TestOutputSeqInReadOrder: chunks of stdout and stderr written in turn,
// some merged and some split at the chunk size, carry Jetcrew-Seq from 1,
// one more per chunk, in the order they were written: ordering by it
// rebuilds the interleaving, with either stream's own bytes unchanged.
func TestOutputSeqInReadOrder(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("z", messages.MaxOutputChunk+10)
	writes := []struct{ stream, data string }{
		{"stdout", "1\n"}, {"stderr", "2\n"}, {"stdout", "3\n"}, {"stdout", "3b\n"},
		{"stderr", "4\n"}, {"stderr", big}, {"stdout", "5\n"}, {"stderr", "6\n"},
	}
	b := setup(t, func(c *worker.Config) {
		rt := workertest.NewTestRuntime(t)
		rt.Behave = func(jail.ContainerSpec) (workertest.Behaviour, error) {
			return func(ctx context.Context, _ jail.ContainerSpec, out jail.OutputFunc) jail.ExitStatus {
				for _, w := range writes {
					out(w.stream, []byte(w.data))
				}
				return jail.ExitStatus{}
			}, nil
		}
		c.Runtime = rt
	})
	b.submit(t, messages.RunRequest{ID: "seq1", Profile: "shell"})
	require.Equal(t, messages.StateSucceeded, b.waitFinal(t, "seq1").State)

	type chunk struct {
		seq    uint64
		stream string
		data   string
	}
	var chunks []chunk
	for _, m := range b.events(t, "seq1") {
		if !strings.HasSuffix(m.Subject(), ".output") {
			continue
		}
		seq, err := strconv.ParseUint(m.Headers().Get(messages.HeaderSeq), 10, 64)
		require.NoError(t, err, "output event without %s", messages.HeaderSeq)
		chunks = append(chunks, chunk{seq, m.Headers().Get(messages.HeaderStream), string(m.Data())})
	}
	var got, want []string
	for i, c := range chunks {
		require.Equal(t, uint64(i+1), c.seq, "chunk %d", i)
		if n := len(got); n > 0 && strings.HasPrefix(got[n-1], c.stream+":") {
			got[n-1] += c.data
		} else {
			got = append(got, c.stream+":"+c.data)
		}
	}
	for _, w := range writes {
		if n := len(want); n > 0 && strings.HasPrefix(want[n-1], w.stream+":") {
			want[n-1] += w.data
		} else {
			want = append(want, w.stream+":"+w.data)
		}
	}
	require.Equal(t, want, got)
}

func TestOrphanReconcile(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	nc := workertest.Connect(t, s)
	rt := workertest.NewTestRuntime(t)
	// A container left by a dead worker "gone", older than the grace period.
	_, err := rt.Start(context.Background(), jail.ContainerSpec{
		Name: "jetcrew-orphan-1", Cmd: []string{"sleep 1h"},
		Labels: map[string]string{jail.LabelManaged: "true", jail.LabelRunID: "orphan", jail.LabelWorker: "gone",
			jail.LabelCreated: time.Now().Add(-time.Hour).Format(time.RFC3339Nano)},
	}, func(string, []byte) {})
	require.NoError(t, err)
	// A young one of the same dead worker: inside the grace period, kept.
	_, err = rt.Start(context.Background(), jail.ContainerSpec{
		Name: "jetcrew-young-1", Cmd: []string{"sleep 1h"},
		Labels: map[string]string{jail.LabelManaged: "true", jail.LabelRunID: "young", jail.LabelWorker: "gone",
			jail.LabelCreated: time.Now().Format(time.RFC3339Nano)},
	}, func(string, []byte) {})
	require.NoError(t, err)
	// Containers are matched to the installation by the stream's creation time.
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = worker.Provision(context.Background(), js, worker.ProvisionConfig{})
	require.NoError(t, err)
	stream, err := js.Stream(context.Background(), messages.StreamRuns)
	require.NoError(t, err)
	install := strconv.FormatInt(stream.CachedInfo().Created.UnixNano(), 36)
	for _, name := range []string{"orphan", "young"} {
		for _, c := range rt.Starts() {
			if c.Name == "jetcrew-"+name+"-1" {
				c.Labels[jail.LabelInstall] = install
			}
		}
	}
	// One of another installation on the same engine: never touched.
	_, err = rt.Start(context.Background(), jail.ContainerSpec{
		Name: "jetcrew-foreign-1", Cmd: []string{"sleep 1h"},
		Labels: map[string]string{jail.LabelManaged: "true", jail.LabelRunID: "foreign", jail.LabelWorker: "gone",
			jail.LabelInstall: "elsewhere", jail.LabelCreated: time.Now().Add(-time.Hour).Format(time.RFC3339Nano)},
	}, func(string, []byte) {})
	require.NoError(t, err)
	w, err := worker.New(nc, worker.Config{StateDir: workertest.StateDir(t), BridgePath: workertest.BridgeFile(t), ID: "w2", Runtime: rt, OrphanGrace: time.Minute})
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	defer w.Stop(context.Background())
	cs, _ := rt.ListManaged(context.Background())
	var names []string
	for _, c := range cs {
		names = append(names, c.Name)
	}
	require.ElementsMatch(t, []string{"jetcrew-young-1", "jetcrew-foreign-1"}, names)
	// The containers the reconciler rightly kept are the test's own: end
	// them (the leak check would see their goroutines).
	for _, c := range cs {
		require.NoError(t, rt.Remove(context.Background(), c.ID))
	}
}

func TestStopHandsBackRuns(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	nc := workertest.Connect(t, s)
	rt := workertest.NewTestRuntime(t)
	w, err := worker.New(nc, worker.Config{StateDir: workertest.StateDir(t), BridgePath: workertest.BridgeFile(t), ID: "w3", Runtime: rt, Concurrency: 1, FetchWait: time.Second})
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	js, _ := jetstream.New(nc)
	_, err = js.Publish(context.Background(), messages.SubjectRuns("default"), []byte(`{"id":"hb1","profile":"shell","prompt":"sleep 1h"}`))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(rt.Starts()) == 1 }, 5*time.Second, 10*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, w.Stop(ctx), context.DeadlineExceeded)
	// The request is back on the stream for another worker, not lost.
	stream, _ := js.Stream(context.Background(), messages.StreamRuns)
	info, _ := stream.Info(context.Background())
	require.Equal(t, uint64(1), info.State.Msgs)
	require.Equal(t, 0, rt.Live())
	require.NoError(t, w.Stop(context.Background()), "Stop twice is safe")
}

func TestFailureReasonDiagnosesJailLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.submit(t, messages.RunRequest{ID: "nospc", Profile: "shell", Prompt: "err dd: error writing '/tmp/f': No space left on device; exit 1"})
	b.submit(t, messages.RunRequest{ID: "fork", Profile: "shell", Prompt: "err sh: can't fork: Resource temporarily unavailable; exit 2"})
	b.submit(t, messages.RunRequest{ID: "oom", Profile: "shell", Prompt: "oom"})
	require.Contains(t, b.waitFinal(t, "nospc").Reason, "no space left on device: a tmpfs is full; /tmp is size=64m")
	require.Contains(t, b.waitFinal(t, "fork").Reason, "pids limit of 256 reached")
	st := b.waitFinal(t, "oom")
	require.Equal(t, "oom", st.Reason)
	require.Equal(t, messages.StateFailed, st.State)
}

// TestStopTwiceConcurrently: two Stop calls at once neither panic nor
// return before the worker has stopped.
func TestStopTwiceConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			err := b.w.Stop(ctx)
			select {
			case <-b.w.Stopped():
			default:
				t.Error("Stop returned before the worker stopped")
			}
			errs <- err
		}()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
}
