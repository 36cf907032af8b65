package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// Waiting on nothing is said within seconds, not endured in silence. A submit
// --wait to a pool no live worker serves exits 1 saying so (the run stays
// queued); with --keep-waiting it reports the queued run's age and its
// pool's depth and runs once a worker of the pool comes. watch of an id known
// nowhere exits 1 at once; of a request still in the queue, it waits.
func TestWaitingOnNothingIsSaid(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	startWorker(t, s, "--id", "w-default")
	url := s.ClientURL()

	start := time.Now()
	code, stdout, stderr := cli(t, url, "submit", "--wait", "--pool", "gpu", "--id", "lonely", "out hi")
	require.Equal(t, 1, code, stderr)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "no live worker serves pool gpu")
	require.Less(t, time.Since(start), 8*time.Second)
	// The run stays queued: no worker took it, so it has no state yet
	// (the submitter writes none, docs/security.md); status shows it
	// queued from its request (issue 27), and watch knows it.
	code, stdout, stderr = cli(t, url, "status", "lonely")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^state: +queued$`, stdout)
	require.Contains(t, stdout, "waiting for a worker of pool gpu")
	ctx0, cancel0 := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel0()
	lw := newTestApp(map[string]string{"NATS_URL": url}, nil)
	require.Equal(t, exitInterrupted, lw.run(ctx0, []string{"watch", "lonely"}))
	require.Contains(t, lw.stderr.String(), "has no state yet; waiting")

	start = time.Now()
	code, _, stderr = cli(t, url, "watch", "nobody-submitted-this")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "run nobody-submitted-this is unknown")
	require.Less(t, time.Since(start), 5*time.Second)

	// A request published raw (no state yet) is known: watch waits for it.
	nc := workertest.Connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.Publish(t.Context(), messages.SubjectRuns("gpu"), []byte(`{"id":"rawq","profile":"shell","prompt":"out raw","pool":"gpu"}`))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	w := newTestApp(map[string]string{"NATS_URL": url}, nil)
	require.Equal(t, exitInterrupted, w.run(ctx, []string{"watch", "rawq"}))
	require.Contains(t, w.stderr.String(), "has no state yet; waiting")

	// --keep-waiting: the queued line, then a worker of the pool runs it.
	sub := newTestApp(map[string]string{"NATS_URL": url}, nil)
	done := make(chan int, 1)
	go func() {
		done <- sub.run(t.Context(), []string{"submit", "--wait", "--keep-waiting", "--pool", "gpu", "--id", "patient", "out at last"})
	}()
	require.Eventually(t, func() bool {
		return strings.Contains(sub.stderr.String(), "--- queued for")
	}, 10*time.Second, 20*time.Millisecond)
	require.Contains(t, sub.stderr.String(), "request(s) in pool gpu; no live worker serves the pool yet")
	startWorker(t, s, "--id", "w-gpu", "--pool", "gpu")
	select {
	case code := <-done:
		require.Equal(t, 0, code, sub.stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatal("submit --keep-waiting did not finish once a worker came")
	}
	require.Equal(t, "at last\n", sub.stdout.String())
}

// A submit against an installation that is still being
// provisioned says so, and with --keep-waiting waits for it.
func TestSubmitWaitsForProvisioning(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	url := s.ClientURL()
	code, _, stderr := cli(t, url, "submit", "out early")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "may still be provisioning: --keep-waiting waits for it")

	sub := newTestApp(map[string]string{"NATS_URL": url}, nil)
	done := make(chan int, 1)
	go func() {
		done <- sub.run(t.Context(), []string{"submit", "--keep-waiting", "--id", "early", "out early"})
	}()
	require.Eventually(t, func() bool {
		return strings.Contains(sub.stderr.String(), "do not exist yet on this server")
	}, 10*time.Second, 20*time.Millisecond)
	startWorker(t, s, "--id", "w-late")
	select {
	case code := <-done:
		require.Equal(t, 0, code, sub.stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatal("submit --keep-waiting did not submit once the worker provisioned")
	}
	require.Equal(t, "early\n", sub.stdout.String())
}
