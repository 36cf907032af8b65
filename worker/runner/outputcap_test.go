package runner

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/runstate"
)

// provisionedJS starts an embedded server with the events stream and
// returns a JetStream context on it, as the worker makes it.
func provisionedJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(runstate.OpAttemptTimeout))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: messages.StreamEvents, Subjects: []string{messages.SubjectEventsPrefix + ".>"}})
	require.NoError(t, err)
	return js
}

// TestOutputWindowBounded: however fast
// a run writes, the worker holds at most outputWindow unacknowledged output
// publishes, and forgets acknowledged ones (before, every chunk's future was
// kept until the run ended: 1 GB of output, 1.22 GB of worker RSS). The
// output still arrives complete.
func TestOutputWindowBounded(t *testing.T) {
	t.Parallel()
	js := provisionedJS(t)
	o := newOutputPublisher(js, "win1", 1, 1)
	o.release()
	const total = 16 << 20
	chunk := make([]byte, 8<<10)
	maxHeld := 0
	for written := 0; written < total; written += len(chunk) {
		o.write(messages.StreamStdout, chunk)
		o.mu.Lock()
		maxHeld = max(maxHeld, len(o.futures))
		o.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := o.close(ctx)
	require.NoError(t, err)
	require.EqualValues(t, total, n)
	require.LessOrEqual(t, maxHeld, outputWindow, "unacknowledged publishes held")
	t.Logf("at most %d publishes held for %d MiB written", maxHeld, total>>20)

	st, err := js.Stream(ctx, messages.StreamEvents)
	require.NoError(t, err)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(messages.SubjectEvents("win1", messages.EventOutput)))
	require.NoError(t, err)
	// The flusher may cut a chunk short every 50 ms: at least this many.
	require.GreaterOrEqual(t, info.State.Msgs, uint64(total/messages.MaxOutputChunk))
}

// TestOutputBudget proves the profile's output budget (max_output_mib):
// past it output is counted and dropped, the rest published exactly.
func TestOutputBudget(t *testing.T) {
	t.Parallel()
	js := provisionedJS(t)
	o := newOutputPublisher(js, "budget1", 1, 1)
	o.budget = profile.Profile{WatchConfig: profile.WatchConfig{MaxOutputMiB: 1}}.MaxOutputBytes()
	o.release()
	chunk := make([]byte, 100<<10)
	for range 30 { // 3000 KiB
		o.write(messages.StreamStderr, chunk)
	}
	n, err := o.close(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 1<<20, n)
	require.EqualValues(t, 30*len(chunk)-(1<<20), o.droppedBytes())
	require.Zero(t, profile.Profile{WatchConfig: profile.WatchConfig{MaxOutputMiB: -1}}.MaxOutputBytes(), "-1 is unlimited")
	p, err := profile.Profile{Name: "x", JailConfig: profile.JailConfig{Image: "i"}, AgentConfig: profile.AgentConfig{Command: []string{"c"}}}.Resolve()
	require.NoError(t, err)
	require.EqualValues(t, profile.DefaultMaxOutputMiB<<20, p.MaxOutputBytes())
	p.MaxOutputMiB = -2
	_, err = p.Resolve()
	require.ErrorContains(t, err, "max_output_mib -2 must be positive, or -1 for unlimited")
}
