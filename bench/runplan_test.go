//go:build bench

package bench

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// Payload sizes of a no-op run's messages, in bytes, as the message count
// (workertest.MessagesPerRun's trace) shows them: the queued state the
// dispatcher writes, the run request, the running state, the started
// event, the final state and the finished event.
const (
	planQueuedBytes   = 426
	planRequestBytes  = 119
	planRunningBytes  = 1108
	planStartedBytes  = 207
	planFinalBytes    = 1171
	planFinishedBytes = 795
)

// headerQueuedRev carries the queued state's revision in a bare run-plan
// request, so the puller's first state write can compare and set on it.
const headerQueuedRev = "Bench-Queued-Rev"

// rawRunPlanLoop is the JetStream floor under a no-op run: bare nats.go
// calls making the stored writes and the requests a coordination-off run
// makes (its message plan), with none of jetcrew's code. Each of
// noopSubmitters goroutines creates a run's queued state in a KV bucket and
// publishes its request (with a Nats-Msg-Id) to a WorkQueue stream;
// noopConcurrency pullers each fetch one request, write the running state
// (compare and set on the queued revision), publish the started event
// without waiting for its PubAck, write the final state (compare and set),
// publish the finished event, and ack. Sizes are a real run's
// (plan*Bytes); storage, replicas and connections as in rawJetStreamLoop.
// It returns a function that does n runs and returns runs per second from
// the first submit to the last ack, with a CPU profile into prof unless
// prof is empty.
func rawRunPlanLoop(t *testing.T, b bed, n int) func(prof string) float64 {
	t.Helper()
	ctx := context.Background()
	pubJS, err := jetstream.New(b.connect(t))
	require.NoError(t, err)
	subJS, err := jetstream.New(b.connect(t))
	require.NoError(t, err)
	_, err = pubJS.CreateStream(ctx, jetstream.StreamConfig{
		Name: "BENCH_PLAN_RUNS", Subjects: []string{"bench.plan.runs"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Replicas: b.replicas,
	})
	require.NoError(t, err)
	_, err = pubJS.CreateStream(ctx, jetstream.StreamConfig{
		Name: "BENCH_PLAN_EVENTS", Subjects: []string{"bench.plan.events.>"},
		Storage: jetstream.FileStorage, Replicas: b.replicas,
	})
	require.NoError(t, err)
	states, err := pubJS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bench-plan-runs", Storage: jetstream.FileStorage, Replicas: b.replicas})
	require.NoError(t, err)
	subStates, err := subJS.KeyValue(ctx, "bench-plan-runs")
	require.NoError(t, err)
	cons, err := subJS.CreateOrUpdateConsumer(ctx, "BENCH_PLAN_RUNS", jetstream.ConsumerConfig{
		Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 1024, Replicas: b.replicas,
	})
	require.NoError(t, err)
	pad := func(n int) []byte { return bytes.Repeat([]byte("x"), n) }
	queued, request, running, started, final, finished :=
		pad(planQueuedBytes), pad(planRequestBytes), pad(planRunningBytes), pad(planStartedBytes), pad(planFinalBytes), pad(planFinishedBytes)

	var acked, target atomic.Int64
	done := make(chan struct{}, 1)
	pctx, stopPullers := context.WithCancel(ctx)
	var pullers sync.WaitGroup
	for range noopConcurrency {
		pullers.Go(func() {
			// Ends when the test does (stopPullers).
			for pctx.Err() == nil {
				fctx, cancel := context.WithTimeout(pctx, 5*time.Second)
				batch, err := cons.Fetch(1, jetstream.FetchContext(fctx))
				if err != nil {
					cancel()
					continue
				}
				for m := range batch.Messages() {
					if err := runPlan(fctx, subJS, subStates, m, running, started, final, finished); err != nil && pctx.Err() == nil {
						t.Errorf("run plan: %v", err)
					}
					if acked.Add(1) == target.Load() {
						done <- struct{}{}
					}
				}
				cancel()
			}
		})
	}
	t.Cleanup(func() { stopPullers(); pullers.Wait() })

	var ids atomic.Int64
	round1 := func(count int) time.Duration {
		acked.Store(0)
		target.Store(int64(count))
		start := time.Now()
		var next atomic.Int64
		var wg sync.WaitGroup
		for range noopSubmitters {
			wg.Go(func() {
				for next.Add(1) <= int64(count) {
					id := fmt.Sprintf("run%09d", ids.Add(1))
					rev, err := states.Create(ctx, id, queued)
					if err != nil {
						t.Errorf("queued state: %v", err)
						return
					}
					msg := nats.NewMsg("bench.plan.runs")
					msg.Data = request
					msg.Header.Set(headerQueuedRev, strconv.FormatUint(rev, 10))
					msg.Header.Set("Bench-Run", id)
					if _, err := pubJS.PublishMsg(ctx, msg, jetstream.WithMsgID(id)); err != nil {
						t.Errorf("publish: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			t.Fatalf("only %d of %d run plans acked", acked.Load(), count)
		}
		return time.Since(start)
	}
	round1(noopWarmup)
	return func(prof string) float64 {
		stop := cpuProfile(t, prof)
		cpu0 := processCPU(t)
		elapsed := round1(n)
		cpu := processCPU(t) - cpu0
		stop()
		t.Logf("%s raw run plan: %d runs in %s, process CPU %s (%.0f µs per run)", b.label, n, elapsed.Round(time.Millisecond),
			cpu.Round(time.Millisecond), float64(cpu.Microseconds())/float64(n))
		return round(float64(n)/elapsed.Seconds(), 1)
	}
}

// runPlan is a puller's part of one bare run plan for request m: running
// state, started event (PubAck not awaited), final state, finished event,
// ack.
func runPlan(ctx context.Context, js jetstream.JetStream, states jetstream.KeyValue, m jetstream.Msg, running, started, final, finished []byte) error {
	id := m.Headers().Get("Bench-Run")
	rev, err := strconv.ParseUint(m.Headers().Get(headerQueuedRev), 10, 64)
	if err != nil {
		return err
	}
	if rev, err = states.Update(ctx, id, running, rev); err != nil {
		return fmt.Errorf("running state: %w", err)
	}
	if _, err := js.PublishAsync("bench.plan.events."+id+".started", started); err != nil {
		return fmt.Errorf("started event: %w", err)
	}
	if _, err := states.Update(ctx, id, final, rev); err != nil {
		return fmt.Errorf("final state: %w", err)
	}
	if _, err := js.Publish(ctx, "bench.plan.events."+id+".finished", finished); err != nil {
		return fmt.Errorf("finished event: %w", err)
	}
	return m.Ack()
}
