package dispatcher

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
)

// testBundle is what setup returns: a fresh server and a Dispatcher on it.
type testBundle struct {
	srv *server.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	d   *Dispatcher
}

type setupOpts struct {
	noJetStream bool
	noProvision bool
}

// runServer starts an embedded nats-server on a random port, with
// JetStream storing under a per-test directory unless noJetStream.
func runServer(t *testing.T, noJetStream bool) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: !noJetStream,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
	})
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second), "nats-server not ready")
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

func setup(t *testing.T, o setupOpts) *testBundle {
	t.Helper()
	s := runServer(t, o.noJetStream)
	nc, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	if !o.noJetStream && !o.noProvision {
		_, err = worker.Provision(t.Context(), js, worker.ProvisionConfig{})
		require.NoError(t, err)
	}
	d, err := New(nc)
	require.NoError(t, err)
	d.finishedGrace = 200 * time.Millisecond
	return &testBundle{srv: s, nc: nc, js: js, d: d}
}

func (b *testBundle) streamMsgs(t *testing.T, name string) uint64 {
	t.Helper()
	st, err := b.js.Stream(t.Context(), name)
	require.NoError(t, err)
	info, err := st.Info(t.Context())
	require.NoError(t, err)
	return info.State.Msgs
}

func (b *testBundle) state(t *testing.T, id string) messages.RunState {
	t.Helper()
	kv, err := b.js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	e, err := kv.Get(t.Context(), id)
	require.NoError(t, err)
	var st messages.RunState
	require.NoError(t, json.Unmarshal(e.Value(), &st))
	return st
}

// publishEvent publishes an event of run id in the wire format a worker
// uses: JSON for lifecycle events.
func (b *testBundle) publishEvent(t *testing.T, ev messages.Event) {
	t.Helper()
	data, err := json.Marshal(ev)
	require.NoError(t, err)
	m := nats.NewMsg(messages.SubjectEvents(ev.RunID, ev.Type))
	m.Data = data
	m.Header.Set(messages.HeaderRunID, ev.RunID)
	m.Header.Set(messages.HeaderAttempt, strconv.Itoa(ev.Attempt))
	_, err = b.js.PublishMsg(t.Context(), m)
	require.NoError(t, err)
}

// publishOutput publishes an output event: raw bytes with stream headers.
func (b *testBundle) publishOutput(t *testing.T, id, stream string, offset int, data string) {
	t.Helper()
	m := nats.NewMsg(messages.SubjectEvents(id, messages.EventOutput))
	m.Data = []byte(data)
	m.Header.Set(messages.HeaderRunID, id)
	m.Header.Set(messages.HeaderStream, stream)
	m.Header.Set(messages.HeaderOffset, strconv.Itoa(offset))
	m.Header.Set(messages.HeaderAttempt, "1")
	_, err := b.js.PublishMsg(t.Context(), m)
	require.NoError(t, err)
}

func intPtr(i int) *int { return &i }

func TestNewNilConn(t *testing.T) {
	t.Parallel()
	_, err := New(nil)
	require.Error(t, err)
}

func TestEncode(t *testing.T) {
	t.Parallel()

	e, err := Encode(messages.RunRequest{Profile: "shell", Prompt: "echo hi"})
	require.NoError(t, err)
	req := e.Request()
	_, err = ulid.ParseStrict(req.ID)
	require.NoError(t, err, "assigned id %q is not a ULID", req.ID)
	require.False(t, e.chosenID, "an assigned id is not the caller's")
	require.Equal(t, messages.DefaultPool, req.Pool)
	require.Equal(t, messages.RequestVersion, req.Version)
	back, err := messages.DecodeRunRequest(e.data)
	require.NoError(t, err)
	require.Equal(t, req, back)

	e2, err := Encode(messages.RunRequest{Profile: "shell"})
	require.NoError(t, err)
	require.NotEqual(t, req.ID, e2.Request().ID)

	e3, err := Encode(messages.RunRequest{ID: "mine", Profile: "shell", Pool: "gpu"})
	require.NoError(t, err)
	require.Equal(t, "mine", e3.Request().ID)
	require.Equal(t, "gpu", e3.Request().Pool)
	require.True(t, e3.chosenID)

	_, err = Encode(messages.RunRequest{Profile: "a b"})
	require.ErrorIs(t, err, messages.ErrInvalidRequest)
}

func TestEncodedWithWorkspace(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + strings.Repeat("ab", 32)
	ref := messages.WorkspaceRef{Name: messages.WorkspaceObjectName(digest), Digest: digest}

	e, err := Encode(messages.RunRequest{ID: "ws", Profile: "shell"})
	require.NoError(t, err)
	w, err := e.WithWorkspace(ref)
	require.NoError(t, err)
	require.Nil(t, e.Request().Workspace, "WithWorkspace returns a copy")
	require.Equal(t, &ref, w.Request().Workspace)
	require.True(t, w.chosenID)
	back, err := messages.DecodeRunRequest(w.data)
	require.NoError(t, err)
	require.Equal(t, w.Request(), back)

	_, err = e.WithWorkspace(messages.WorkspaceRef{Name: "x", Digest: "not a digest"})
	require.ErrorIs(t, err, messages.ErrInvalidRequest)

	// The prompt fits alone, not with the workspace field beside it.
	big, err := Encode(messages.RunRequest{ID: "big", Profile: "shell",
		Prompt: strings.Repeat("x", messages.MaxRequestBytes-len(`{"version":1,"id":"big","profile":"shell","prompt":"","pool":"default"}`))})
	require.NoError(t, err)
	_, err = big.WithWorkspace(ref)
	require.ErrorIs(t, err, messages.ErrInvalidRequest)
	require.ErrorContains(t, err, "largest allowed")

	_, err = Encoded{}.WithWorkspace(ref)
	require.ErrorIs(t, err, messages.ErrInvalidRequest)
}

func TestSubmit(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	id, err := b.d.Submit(t.Context(), messages.RunRequest{
		Profile: "shell",
		Prompt:  "echo hi",
		Timeout: messages.Duration(90 * time.Second),
		Env:     map[string]string{"GREETING": "hi"},
		Labels:  map[string]string{"team": "infra"},
	})
	require.NoError(t, err)
	_, err = ulid.ParseStrict(id)
	require.NoError(t, err)

	st, err := b.js.Stream(t.Context(), messages.StreamRuns)
	require.NoError(t, err)
	msg, err := st.GetMsg(t.Context(), 1)
	require.NoError(t, err)
	require.Equal(t, messages.SubjectRuns(messages.DefaultPool), msg.Subject)
	require.Equal(t, id, msg.Header.Get(jetstream.MsgIDHeader))
	req, err := messages.DecodeRunRequest(msg.Data)
	require.NoError(t, err)
	require.Equal(t, id, req.ID)
	require.Equal(t, "echo hi", req.Prompt)
	require.Equal(t, messages.Duration(90*time.Second), req.Timeout)
	require.Equal(t, map[string]string{"GREETING": "hi"}, req.Env)

	// Submit writes no state: the worker records the run when it takes it,
	// so a submitter needs no write access to the bucket.
	_, err = b.d.Status(t.Context(), id)
	require.ErrorIs(t, err, ErrRunNotFound)
}

func TestSubmitEncoded(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	_, err := b.d.SubmitEncoded(t.Context(), Encoded{}, nil)
	require.ErrorIs(t, err, messages.ErrInvalidRequest)
	require.Zero(t, b.streamMsgs(t, messages.StreamRuns), "nothing is published for an Encoded that Encode did not make")

	e, err := Encode(messages.RunRequest{Profile: "shell", Prompt: "echo hi"})
	require.NoError(t, err)
	id, err := b.d.SubmitEncoded(t.Context(), e, nil)
	require.NoError(t, err)
	require.Equal(t, e.Request().ID, id)
	st, err := b.js.Stream(t.Context(), messages.StreamRuns)
	require.NoError(t, err)
	msg, err := st.GetMsg(t.Context(), 1)
	require.NoError(t, err)
	require.Equal(t, e.data, msg.Data, "the encoding Encode made is what is published")
	require.Equal(t, id, msg.Header.Get(jetstream.MsgIDHeader))
}

func TestSubmitPoolAndGroup(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	id, err := b.d.Submit(t.Context(), messages.RunRequest{ID: "run-1", Profile: "shell", Pool: "gpu", Group: "crew"})
	require.NoError(t, err)
	require.Equal(t, "run-1", id)
	st, err := b.js.Stream(t.Context(), messages.StreamRuns)
	require.NoError(t, err)
	msg, err := st.GetLastMsgForSubject(t.Context(), messages.SubjectRuns("gpu"))
	require.NoError(t, err)
	require.Equal(t, "run-1", msg.Header.Get(jetstream.MsgIDHeader))
	req, err := messages.DecodeRunRequest(msg.Data)
	require.NoError(t, err)
	require.Equal(t, "gpu", req.Pool)
	require.Equal(t, "crew", req.Group)
}

func TestSubmitDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	req := messages.RunRequest{ID: "dup", Profile: "shell", Prompt: "true"}

	_, err := b.d.Submit(t.Context(), req)
	require.NoError(t, err)

	// A worker moves the run on; a duplicate submit must not reset it.
	kv, err := b.js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	running := messages.RunState{Version: messages.StateVersion, ID: "dup", Pool: messages.DefaultPool}
	running.State = messages.StateRunning
	running.Worker = "w1"
	data, err := json.Marshal(running)
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), "dup", data)
	require.NoError(t, err)

	id, err := b.d.Submit(t.Context(), req)
	require.ErrorIs(t, err, ErrDuplicateSubmit, "a duplicate publish says so")
	require.ErrorContains(t, err, "jetcrew replay dup")
	require.Equal(t, "dup", id)
	require.Equal(t, uint64(1), b.streamMsgs(t, messages.StreamRuns), "the duplicate publish must be dropped")
	require.Equal(t, messages.StateRunning, b.state(t, "dup").State)
}

func TestSubmitInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	tests := []struct {
		name string
		req  messages.RunRequest
		want string
	}{
		{"no profile", messages.RunRequest{ID: "r1", Prompt: "x"}, "profile is required"},
		{"bad id", messages.RunRequest{ID: "a.b", Profile: "shell"}, "id"},
		{"bad pool", messages.RunRequest{ID: "r2", Profile: "shell", Pool: "a>"}, "pool"},
		{"bad env name", messages.RunRequest{ID: "r3", Profile: "shell", Env: map[string]string{"1X": "y"}}, "env name"},
		{"reserved env", messages.RunRequest{ID: "r4", Profile: "shell", Env: map[string]string{"JETCREW_RUN_ID": "y"}}, "reserved"},
		{"negative timeout", messages.RunRequest{ID: "r5", Profile: "shell", Timeout: -1}, "negative"},
		{"version", messages.RunRequest{ID: "r6", Profile: "shell", Version: 2}, "version"},
		{"oversize", messages.RunRequest{ID: "r7", Profile: "shell", Prompt: strings.Repeat("x", messages.MaxRequestBytes)}, "largest allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b.d.Submit(t.Context(), tt.req)
			require.ErrorIs(t, err, messages.ErrInvalidRequest)
			require.ErrorContains(t, err, tt.want)
			if tt.req.ID != "" && messages.ValidateToken("id", tt.req.ID) == nil {
				_, err = b.d.Status(t.Context(), tt.req.ID)
				require.ErrorIs(t, err, ErrRunNotFound, "no state may be written for a refused request")
			}
		})
	}
	require.Zero(t, b.streamMsgs(t, messages.StreamRuns))
}

func TestSubmitNotProvisioned(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noProvision: true})

	_, err := b.d.Submit(t.Context(), messages.RunRequest{Profile: "shell"})
	require.ErrorIs(t, err, ErrNotProvisioned)
	require.ErrorContains(t, err, "jetcrew up")

	_, err = b.d.Status(t.Context(), "x")
	require.ErrorIs(t, err, ErrNotProvisioned)

	_, err = b.d.Watch(t.Context(), "x", nil)
	require.ErrorIs(t, err, ErrNotProvisioned)
}

func TestSubmitStreamMissing(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	require.NoError(t, b.js.DeleteStream(t.Context(), messages.StreamRuns))

	_, err := b.d.Submit(t.Context(), messages.RunRequest{ID: "lost", Profile: "shell"})
	require.ErrorIs(t, err, ErrNotProvisioned)
	_, err = b.d.Status(t.Context(), "lost")
	require.ErrorIs(t, err, ErrRunNotFound, "an unpublished request has no state")
}

func TestNoJetStream(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noJetStream: true})

	_, err := b.d.Submit(t.Context(), messages.RunRequest{Profile: "shell"})
	require.ErrorIs(t, err, ErrNoJetStream)
}

func TestStatus(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	_, err := b.d.Status(t.Context(), "nope")
	require.ErrorIs(t, err, ErrRunNotFound)
	require.ErrorContains(t, err, "nope")

	_, err = b.d.Status(t.Context(), "a.b")
	require.ErrorIs(t, err, messages.ErrInvalidToken)
}

func TestWatchReplaysFinishedRun(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const id = "done-run"

	b.publishEvent(t, messages.Event{RunID: id, Type: messages.EventStarted, Attempt: 1, Worker: "w1", ContainerID: "c1"})
	b.publishOutput(t, id, messages.StreamStdout, 0, "hello\n")
	b.publishOutput(t, id, messages.StreamStderr, 0, "oops\xff")
	b.publishOutput(t, id, messages.StreamStdout, 6, "world\n")
	b.publishEvent(t, messages.Event{RunID: id, Type: messages.EventFinished, Attempt: 1, State: messages.StateFailed, ExitCode: intPtr(3), Reason: "exit code 3"})
	// Another run's events must not show up.
	b.publishOutput(t, "other", messages.StreamStdout, 0, "not mine")

	var got []WatchEvent
	fin, err := b.d.Watch(t.Context(), id, func(ev WatchEvent) error {
		got = append(got, ev)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, messages.StateFailed, fin.State)
	require.Equal(t, 3, *fin.ExitCode)
	require.Equal(t, "exit code 3", fin.Reason)

	require.Len(t, got, 5)
	require.Equal(t, messages.EventStarted, got[0].Type)
	require.Equal(t, "c1", got[0].Event.ContainerID)
	require.Equal(t, 1, got[0].Attempt)
	require.Equal(t, messages.EventOutput, got[1].Type)
	require.Equal(t, messages.StreamStdout, got[1].Stream)
	require.Equal(t, "hello\n", string(got[1].Data))
	require.Equal(t, messages.StreamStderr, got[2].Stream)
	require.Equal(t, "oops\xff", string(got[2].Data), "output is raw bytes")
	require.Equal(t, int64(6), got[3].Offset)
	require.Equal(t, messages.EventFinished, got[4].Type)
	require.False(t, got[4].FromState)
	for i, ev := range got {
		require.NotZero(t, ev.Sequence, "event %d", i)
		require.False(t, ev.Time.IsZero(), "event %d", i)
	}
}

func TestWatchLive(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const id = "live-run"

	var (
		mu  sync.Mutex
		out strings.Builder
	)
	seen := make(chan messages.EventType, 16)
	type result struct {
		ev  messages.Event
		err error
	}
	res := make(chan result, 1)
	go func() {
		ev, err := b.d.Watch(t.Context(), id, func(ev WatchEvent) error {
			if ev.Type == messages.EventOutput {
				mu.Lock()
				out.Write(ev.Data)
				mu.Unlock()
			}
			seen <- ev.Type
			return nil
		})
		res <- result{ev, err}
	}()

	b.publishEvent(t, messages.Event{RunID: id, Type: messages.EventStarted, Attempt: 1})
	require.Equal(t, messages.EventStarted, <-seen)
	b.publishOutput(t, id, messages.StreamStdout, 0, "streamed")
	require.Equal(t, messages.EventOutput, <-seen)
	b.publishEvent(t, messages.Event{RunID: id, Type: messages.EventFinished, Attempt: 1, State: messages.StateSucceeded, ExitCode: intPtr(0)})

	r := <-res
	require.NoError(t, r.err)
	require.Equal(t, messages.StateSucceeded, r.ev.State)
	mu.Lock()
	require.Equal(t, "streamed", out.String())
	mu.Unlock()
}

func TestWatchFinishedFromState(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	// The run's events expired (or the finished event was lost), but its
	// state is final: Watch must not wait forever.
	kv, err := b.js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	finished := time.Now().UTC().Truncate(time.Millisecond)
	data, err := json.Marshal(messages.RunState{
		Version: messages.StateVersion, ID: "old", State: messages.StateTimedOut,
		Attempts: 2, Worker: "w1", ExitCode: intPtr(137), Reason: "timed out after 1s",
		FinishedAt: finished,
	})
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), "old", data)
	require.NoError(t, err)

	var got []WatchEvent
	fin, err := b.d.Watch(t.Context(), "old", func(ev WatchEvent) error {
		got = append(got, ev)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, messages.EventFinished, fin.Type)
	require.Equal(t, messages.StateTimedOut, fin.State)
	require.Equal(t, 137, *fin.ExitCode)
	require.Equal(t, 2, fin.Attempt)
	require.True(t, finished.Equal(fin.Time))
	require.Len(t, got, 1)
	require.True(t, got[0].FromState)

	st, err := b.d.Wait(t.Context(), "old")
	require.NoError(t, err)
	require.Equal(t, messages.StateTimedOut, st.State)
}

func TestWatchContextEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err := b.d.Watch(ctx, "never", nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestWatchCallbackError(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const id = "cb"
	b.publishOutput(t, id, messages.StreamStdout, 0, "x")
	b.publishEvent(t, messages.Event{RunID: id, Type: messages.EventFinished, State: messages.StateSucceeded})

	errStop := &stopError{}
	calls := 0
	_, err := b.d.Watch(t.Context(), id, func(WatchEvent) error {
		calls++
		return errStop
	})
	require.ErrorIs(t, err, errStop)
	require.Equal(t, 1, calls)
}

type stopError struct{}

func (*stopError) Error() string { return "stop" }

func TestWatchInvalidID(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := b.d.Watch(t.Context(), "a.>", nil)
	require.ErrorIs(t, err, messages.ErrInvalidToken)
}

func TestWaitAfterSubmit(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	id, err := b.d.Submit(t.Context(), messages.RunRequest{Profile: "shell", Prompt: "true"})
	require.NoError(t, err)

	// Play the worker: record the final state, then the finished event.
	kv, err := b.js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	st := messages.RunState{Version: messages.StateVersion, ID: id, Pool: messages.DefaultPool, State: messages.StateSucceeded, ExitCode: intPtr(0)}
	data, err := json.Marshal(st)
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), id, data)
	require.NoError(t, err)
	b.publishEvent(t, messages.Event{RunID: id, Type: messages.EventFinished, State: messages.StateSucceeded, ExitCode: intPtr(0)})

	got, err := b.d.Wait(t.Context(), id)
	require.NoError(t, err)
	require.Equal(t, messages.StateSucceeded, got.State)
	require.Equal(t, 0, *got.ExitCode)
}

// A pool holding its most requests refuses the next submit, which says so
// (ErrQueueFull); the requests already queued stay.
func TestSubmitPoolFull(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := worker.Provision(t.Context(), b.js, worker.ProvisionConfig{RunsMaxPerPool: 2})
	require.NoError(t, err)
	for range 2 {
		_, err := b.d.Submit(t.Context(), messages.RunRequest{Profile: "shell", Pool: "p"})
		require.NoError(t, err)
	}
	_, err = b.d.Submit(t.Context(), messages.RunRequest{Profile: "shell", Pool: "p"})
	require.ErrorIs(t, err, ErrQueueFull)
	require.ErrorContains(t, err, "maximum messages per subject exceeded")
	require.Equal(t, uint64(2), b.streamMsgs(t, messages.StreamRuns))
	_, err = b.d.Submit(t.Context(), messages.RunRequest{Profile: "shell", Pool: "q"})
	require.NoError(t, err, "another pool still takes requests")
}

// Requests for a pool without a workers-<pool> consumer are listed, its
// replay subject's counted with them, with when the oldest is removed;
// a served pool's are not.
func TestUnservedPools(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}) // provisions pool default's consumer
	ctx := t.Context()
	for _, subj := range []string{messages.SubjectRuns("nopool"), messages.SubjectReplay("nopool"), messages.SubjectRuns("default")} {
		_, err := b.js.Publish(ctx, subj, []byte(`{"profile":"shell"}`))
		require.NoError(t, err)
	}
	got, err := b.d.UnservedPools(ctx)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, "nopool", got[0].Pool)
	require.Equal(t, uint64(2), got[0].Requests)
	require.WithinDuration(t, time.Now(), got[0].Oldest, time.Minute)
	require.Equal(t, worker.DefaultRunsMaxAge, got[0].Expires.Sub(got[0].Oldest))

	nb := setup(t, setupOpts{noProvision: true})
	_, err = nb.d.UnservedPools(ctx)
	require.ErrorIs(t, err, ErrNotProvisioned)
}
