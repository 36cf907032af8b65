package main

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// TestStreamCapsAndStoreLimit proves that what jetcrew stores cannot fill
// the disk: `up`'s embedded server has a store limit (--store-max-mib, default 4096 MiB) that
// holds every stream at its default byte cap, and every stream a worker
// provisions has a byte cap, set from the flags.
func TestStreamCapsAndStoreLimit(t *testing.T) {
	t.Parallel()
	opts := embeddedServerOptions("127.0.0.1", -1, t.TempDir(), defaultStoreMaxMiB)
	opts.NoLog = true
	s, err := server.NewServer(opts)
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	require.EqualValues(t, int64(defaultStoreMaxMiB)<<20, s.JetStreamConfig().MaxStore)

	// The default caps fit the default store: a worker starts.
	startWorker(t, s)
	js, err := jetstream.New(workertest.Connect(t, s))
	require.NoError(t, err)
	want := map[string]int64{
		messages.StreamRuns:     worker.DefaultRunsMaxBytes,
		messages.StreamEvents:   worker.DefaultEventsMaxBytes,
		messages.StreamFailed:   worker.DefaultFailedMaxBytes,
		coordination.StreamName: coordination.MaxStreamBytes,
	}
	for name, max := range want {
		// The coordination stream may come a moment after the consumer the
		// worker's readiness is judged by.
		var st jetstream.Stream
		require.Eventually(t, func() bool {
			st, err = js.Stream(context.Background(), name)
			return err == nil
		}, 10*time.Second, 20*time.Millisecond, "stream %s: %v", name, err)
		require.Equal(t, max, st.CachedInfo().Config.MaxBytes, name)
	}

	// The flags set them, and a full JETCREW_RUNS refuses a submit instead
	// of dropping a queued request.
	s2 := workertest.StartServer(t)
	startWorker(t, s2, "--runs-max-mib", "1", "--events-max-mib", "2", "--failed-max-mib", "3")
	js2, err := jetstream.New(workertest.Connect(t, s2))
	require.NoError(t, err)
	for name, max := range map[string]int64{messages.StreamRuns: 1 << 20, messages.StreamEvents: 2 << 20, messages.StreamFailed: 3 << 20} {
		st, err := js2.Stream(context.Background(), name)
		require.NoError(t, err, name)
		require.Equal(t, max, st.CachedInfo().Config.MaxBytes, name)
	}
	st, err := js2.Stream(context.Background(), messages.StreamRuns)
	require.NoError(t, err)
	require.Equal(t, jetstream.DiscardNew, st.CachedInfo().Config.Discard)

	code, _, stderr := cli(t, s2.ClientURL(), "worker", "--events-max-mib", "0")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--events-max-mib 0: must be positive, or -1 for no cap")
}

// JETCREW_RUNS' limits beside its byte cap: a request no worker takes is
// removed after --runs-max-age (default 7 days), one pool holds at most
// --runs-max-per-pool requests (default 512), and no message is larger than
// the largest valid request. The flags set them on `worker` and `up`, and
// refuse values that would lose requests.
func TestRunsLimitFlags(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	startWorker(t, s)
	js, err := jetstream.New(workertest.Connect(t, s))
	require.NoError(t, err)
	st, err := js.Stream(context.Background(), messages.StreamRuns)
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	require.Equal(t, 7*24*time.Hour, cfg.MaxAge)
	require.EqualValues(t, 512, cfg.MaxMsgsPerSubject)
	require.True(t, cfg.DiscardNewPerSubject)
	require.EqualValues(t, messages.MaxRequestMsgBytes, cfg.MaxMsgSize)

	s2 := workertest.StartServer(t)
	startWorker(t, s2, "--runs-max-age", "48h", "--runs-max-per-pool", "10")
	js2, err := jetstream.New(workertest.Connect(t, s2))
	require.NoError(t, err)
	st, err = js2.Stream(context.Background(), messages.StreamRuns)
	require.NoError(t, err)
	cfg = st.CachedInfo().Config
	require.Equal(t, 48*time.Hour, cfg.MaxAge)
	require.EqualValues(t, 10, cfg.MaxMsgsPerSubject)

	for _, cmd := range []string{"worker", "up"} {
		for _, tc := range []struct{ flag, value, want string }{
			{"--runs-max-age", "1h", "--runs-max-age 1h0m0s: must be at least 24h0m0s"},
			{"--runs-max-per-pool", "0", "--runs-max-per-pool 0: must be positive, or -1 for no limit"},
			{"--runs-max-per-pool", "-2", "--runs-max-per-pool -2: must be positive, or -1 for no limit"},
			{"--runs-max-per-pool", "3", "--runs-max-per-pool 3 is below --concurrency 4"},
		} {
			code, _, stderr := cli(t, s2.ClientURL(), cmd, tc.flag, tc.value)
			require.Equal(t, exitUsage, code, "%s %s %s: %s", cmd, tc.flag, tc.value, stderr)
			require.Contains(t, stderr, tc.want)
		}
	}
}
