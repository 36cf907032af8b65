//go:build bench

package bench

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// Payload sizes of a no-op run's messages, in bytes, as the message count
// (msgcount.MessagesPerRun's trace) shows them: the queued state the
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

// Headers of a bare run-plan request: the queued state's revision, so the
// puller's first state write can compare and set on it, and the run's id.
const (
	headerQueuedRev = "Bench-Queued-Rev"
	headerRun       = "Bench-Run"
)

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
// It returns pulledLoop's function for rounds of n runs: runs per second
// from the first submit to the last ack.
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

	var ids atomic.Int64
	return pulledLoop(t, b.label+" raw run plan", "run", n, cons,
		func() error {
			id := fmt.Sprintf("run%09d", ids.Add(1))
			rev, err := states.Create(ctx, id, queued)
			if err != nil {
				return fmt.Errorf("queued state: %w", err)
			}
			msg := nats.NewMsg("bench.plan.runs")
			msg.Data = request
			msg.Header.Set(headerQueuedRev, strconv.FormatUint(rev, 10))
			msg.Header.Set(headerRun, id)
			_, err = pubJS.PublishMsg(ctx, msg, jetstream.WithMsgID(id))
			return err
		},
		func(ctx context.Context, m jetstream.Msg) error {
			return runPlan(ctx, subJS, subStates, m, running, started, final, finished)
		})
}

// runPlan is a puller's part of one bare run plan for request m: running
// state, started event (PubAck not awaited), final state, finished event,
// ack.
func runPlan(ctx context.Context, js jetstream.JetStream, states jetstream.KeyValue, m jetstream.Msg, running, started, final, finished []byte) error {
	id := m.Headers().Get(headerRun)
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
