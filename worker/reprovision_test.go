package worker_test

import (
	"context"
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// restartableServer is an embedded nats-server a test restarts on the same
// port and store, as an operator restarting nats-server would.
type restartableServer struct {
	t    *testing.T
	opts server.Options
	s    *server.Server
}

func startRestartable(t *testing.T) *restartableServer {
	t.Helper()
	r := &restartableServer{t: t, opts: server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), NoSigs: true, NoLog: true}}
	r.start()
	r.opts.Port = r.s.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() { r.s.Shutdown(); r.s.WaitForShutdown() })
	return r
}

func (r *restartableServer) start() {
	opts := r.opts
	s, err := server.NewServer(&opts)
	require.NoError(r.t, err)
	go s.Start()
	require.True(r.t, s.ReadyForConnections(10*time.Second))
	r.s = s
}

func (r *restartableServer) restart() {
	r.s.Shutdown()
	r.s.WaitForShutdown()
	r.start()
}

// TestReprovisionAfterServerRestart: nats-server
// restarted on the same store under a live worker loses the memory-storage
// buckets (heartbeats, coordination presence); the worker finds them missing
// and provisions them again, so its heartbeat is back and a later run's
// coordination is available.
func TestReprovisionAfterServerRestart(t *testing.T) {
	t.Parallel()
	srv := startRestartable(t)
	nc, err := nats.Connect(srv.s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	w, err := worker.New(nc, worker.Config{StateDir: workertest.StateDir(t), BridgePath: workertest.BridgeFile(t), ID: "w1",
		Runtime: workertest.NewTestRuntime(t), Concurrency: 2, FetchWait: 2 * time.Second})
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
	})

	srv.restart()
	cl, err := nats.Connect(srv.s.ClientURL())
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	js, err := jetstream.New(cl)
	require.NoError(t, err)
	_, err = js.KeyValue(context.Background(), messages.BucketWorkers)
	require.ErrorIs(t, err, jetstream.ErrBucketNotFound, "the restart lost the memory bucket (the bug's premise)")

	// Within a heartbeat or two (WorkerTTL/3 each), both buckets are back
	// and the worker's heartbeat with them.
	require.Eventually(t, func() bool {
		live, err := js.KeyValue(context.Background(), messages.BucketWorkers)
		if err != nil {
			return false
		}
		_, err = live.Get(context.Background(), "w1")
		if err != nil {
			return false
		}
		_, err = js.KeyValue(context.Background(), coordination.BucketPeers)
		return err == nil
	}, 3*messages.WorkerTTL/2, 100*time.Millisecond, "the worker re-provisioned nothing")

	data := []byte(`{"id":"after","profile":"shell","prompt":"out hello"}`)
	_, err = js.Publish(context.Background(), messages.SubjectRuns(messages.DefaultPool), data)
	require.NoError(t, err)
	var st messages.RunState
	require.Eventually(t, func() bool {
		kv, err := js.KeyValue(context.Background(), messages.BucketRuns)
		if err != nil {
			return false
		}
		e, err := kv.Get(context.Background(), "after")
		if err != nil {
			return false
		}
		return json.Unmarshal(e.Value(), &st) == nil && st.State.Final()
	}, 20*time.Second, 50*time.Millisecond)
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	// "unused": its socket was served (the presence bucket is back) and the
	// shell profile's /bin/sh never dialled it; "unavailable" would mean
	// Serve failed.
	require.Contains(t, []string{"available", "unused"}, st.Coordination, "coordination works after the restart")
}
