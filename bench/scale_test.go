//go:build bench

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// Sizes of the scaling benchmark: every run sleeps scaleSleep in its fake
// container, every worker has scaleConcurrency slots, so k workers can do at
// most k*scaleConcurrency/scaleSleep runs per second. Each configuration gets
// about scaleSeconds of work.
const (
	scaleSleep       = 250 * time.Millisecond
	scaleConcurrency = 4
	scaleSeconds     = 6
)

// TestScaling measures throughput with 1, 2 and 4 workers sharing the pool's
// consumer, on a runtime whose containers sleep: the queue is loaded first,
// then the workers start together, and the clock runs from their start to
// the last finished event. Each configuration gets a fresh embedded server.
// The workers live in this process, each with its own NATS connection, as
// separate machines would have.
func TestScaling(t *testing.T) {
	rates := map[int]float64{}
	for _, k := range []int{1, 2, 4} {
		rates[k] = scaleRun(t, k)
		ideal := float64(k*scaleConcurrency) / scaleSleep.Seconds()
		fig := Figure{Value: round(rates[k], 2), Unit: "runs/s", Samples: k * scaleConcurrency * scaleSeconds * int(time.Second/scaleSleep),
			What: fmt.Sprintf("%d worker(s) × concurrency %d, fake containers sleeping %s (built-in shell profile, coordination on); ideal %.0f runs/s, measured %.0f%% of it", k, scaleConcurrency, scaleSleep, ideal, 100*rates[k]/ideal)}
		if k > 1 {
			fig.Baseline = "scale_1w_runs_per_s"
			fig.What += fmt.Sprintf("; ideal ratio to 1 worker %d×", k)
		}
		record(t, fmt.Sprintf("scale_%dw_runs_per_s", k), fig)
	}
}

func scaleRun(t *testing.T, k int) float64 {
	t.Helper()
	s := workertest.StartServer(t)
	ctx := context.Background()
	js, err := jetstream.New(workertest.Connect(t, s))
	require.NoError(t, err)
	_, err = worker.Provision(ctx, js, worker.ProvisionConfig{})
	require.NoError(t, err)

	n := k * scaleConcurrency * scaleSeconds * int(time.Second/scaleSleep)
	watch := workertest.Connect(t, s)
	var finished, failed atomic.Int64
	done := make(chan struct{}, 1)
	sub, err := watch.Subscribe(messages.SubjectEventsPrefix+".*."+string(messages.EventFinished), func(m *nats.Msg) {
		var ev messages.Event
		if json.Unmarshal(m.Data, &ev) != nil || ev.State != messages.StateSucceeded {
			failed.Add(1)
		}
		if finished.Add(1) == int64(n) {
			done <- struct{}{}
		}
	})
	require.NoError(t, err)
	sub.SetPendingLimits(-1, -1)
	defer sub.Unsubscribe()
	require.NoError(t, watch.Flush())

	d, err := dispatcher.New(workertest.Connect(t, s))
	require.NoError(t, err)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range noopSubmitters {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if _, err := d.Submit(ctx, messages.RunRequest{Profile: "shell", Prompt: "sleep " + scaleSleep.String()}); err != nil {
					t.Errorf("submit: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()

	ws := make([]*worker.Worker, k)
	for i := range k {
		w, err := worker.New(workertest.Connect(t, s), worker.Config{
			ID: fmt.Sprintf("bench-scale-%d", i), Runtime: workertest.NewTestRuntime(t), Concurrency: scaleConcurrency,
			StateDir: workertest.StateDir(t), BridgePath: workertest.BridgeFile(t),
		})
		require.NoError(t, err)
		ws[i] = w
	}
	start := time.Now()
	var starts sync.WaitGroup
	for _, w := range ws {
		starts.Go(func() {
			if err := w.Start(ctx); err != nil {
				t.Errorf("start worker: %v", err)
			}
		})
	}
	starts.Wait()
	if t.Failed() {
		t.FailNow()
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("%d workers: only %d of %d runs finished", k, finished.Load(), n)
	}
	elapsed := time.Since(start)
	require.Zero(t, failed.Load())
	for _, w := range ws {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		require.NoError(t, w.Stop(sctx))
		cancel()
	}
	t.Logf("%d worker(s): %d runs in %s", k, n, elapsed.Round(time.Millisecond))
	return float64(n) / elapsed.Seconds()
}
