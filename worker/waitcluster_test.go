package worker_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Provisioning a fresh R3 cluster takes seconds (measured
// and logged here), and a worker started while its cluster cannot serve
// JetStream (two of three nodes down: no meta leader) waits for it, logging
// what it waits for, instead of exiting; it is ready seconds after quorum.
func TestWorkerWaitsForTheCluster(t *testing.T) {
	t.Parallel()
	c := workertest.StartCluster(t, 3)
	connect := func() *nats.Conn {
		nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}
	prov := worker.ProvisionConfig{Replicas: 3, AckWait: 5 * time.Second}
	js, err := jetstream.New(connect())
	require.NoError(t, err)
	start := time.Now()
	_, err = worker.Provision(t.Context(), js, prov)
	require.NoError(t, err)
	require.NoError(t, coordination.Provision(t.Context(), js, 3))
	fresh := time.Since(start)
	t.Logf("fresh R3 cluster: every stream, bucket and consumer provisioned in %s", fresh.Round(time.Millisecond))
	require.Less(t, fresh, 30*time.Second, "provisioning a fresh R3 cluster takes seconds, not minutes")

	c.Kill(1)
	c.Kill(2)
	// Once the survivor knows it has lost its quorum, it says JetStream is
	// unavailable.
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err != nil
	}, 60*time.Second, 100*time.Millisecond)
	var logs lockedBuffer
	log := zerolog.New(&logs)
	w, err := worker.New(connect(), worker.Config{StateDir: workertest.StateDir(t), BridgePath: workertest.BridgeFile(t), ID: "waiter",
		Runtime: workertest.NewTestRuntime(t), Concurrency: 2, FetchWait: time.Second, Provision: prov, Logger: &log})
	require.NoError(t, err)
	started := make(chan error, 1)
	go func() { started <- w.Start(t.Context()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
	})
	require.Eventually(t, func() bool {
		return bytes.Contains([]byte(logs.String()), []byte("waiting for the NATS cluster to serve JetStream"))
	}, 90*time.Second, 50*time.Millisecond, "the worker says what it waits for")
	select {
	case err := <-started:
		t.Fatalf("Start returned while the cluster had no quorum: %v", err)
	default:
	}
	require.Contains(t, logs.String(), `"waiting_for":"jetcrew's streams, buckets and consumer"`)

	quorum := time.Now()
	c.Restart(1)
	c.Restart(2)
	select {
	case err := <-started:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatalf("worker not ready 60s after the cluster regained quorum; log:\n%s", logs.String())
	}
	t.Logf("worker ready %s after the cluster regained quorum", time.Since(quorum).Round(time.Millisecond))
}
