//go:build bench

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// Payload sizes of a no-op run's messages, in bytes, as the message count
// (msgcount.MessagesPerRun's trace) shows them: the run request, the
// queued state the worker's claim creates, the running state, the started
// event, the final state and the finished event.
const (
	planRequestBytes  = 119
	planQueuedBytes   = 426
	planRunningBytes  = 1108
	planStartedBytes  = 207
	planFinalBytes    = 1171
	planFinishedBytes = 795
)

// headerRun carries a bare run plan's run id on its request (a real
// request carries it in its body).
const headerRun = "Bench-Run"

// rawRunPlanLoop is the JetStream floor under a no-op run: bare nats.go
// calls making the stored writes and the requests a coordination-off run
// makes (its message plan), with none of jetcrew's code. Each of
// noopSubmitters goroutines publishes a request (with its run id as
// Nats-Msg-Id, as the dispatcher does) to a WorkQueue stream;
// noopConcurrency pullers each fetch one request, create its queued state
// in a KV bucket (the worker's claim), write the running state (compare and
// set), publish the started event without waiting for its PubAck, write the
// final state (compare and set), publish the finished event, and ack. The
// events carry the headers a run's do (run id, attempt, a Nats-Msg-Id the
// stream deduplicates on), and a watcher on a connection of its own reads
// the state of each finished event, as the no-op loop's does; a round ends
// when it has seen them all. Sizes are a real run's (plan*Bytes); storage,
// replicas and connections as in rawJetStreamLoop. It returns pulledLoop's
// function for rounds of n runs: runs per second from the first submit to
// the last finished event.
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
		Duplicates: 2 * time.Minute,
	})
	require.NoError(t, err)
	_, err = pubJS.CreateStream(ctx, jetstream.StreamConfig{
		Name: "BENCH_PLAN_EVENTS", Subjects: []string{"bench.plan.events.>"},
		Storage: jetstream.FileStorage, Replicas: b.replicas, Duplicates: 2 * time.Minute,
	})
	require.NoError(t, err)
	_, err = pubJS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bench-plan-runs", History: 5, Storage: jetstream.FileStorage, Replicas: b.replicas})
	require.NoError(t, err)
	subStates, err := subJS.KeyValue(ctx, "bench-plan-runs")
	require.NoError(t, err)
	cons, err := subJS.CreateOrUpdateConsumer(ctx, "BENCH_PLAN_RUNS", jetstream.ConsumerConfig{
		Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 1024, Replicas: b.replicas,
	})
	require.NoError(t, err)
	pad := func(n int) []byte { return bytes.Repeat([]byte("x"), n) }
	// The finished event is JSON with its state, as a run's, for the
	// watcher to read.
	finishedDoc := []byte(`{"state":"succeeded","pad":"`)
	finishedDoc = append(append(finishedDoc, pad(planFinishedBytes-len(finishedDoc)-2)...), '"', '}')
	request, queued, running, started, final :=
		pad(planRequestBytes), pad(planQueuedBytes), pad(planRunningBytes), pad(planStartedBytes), pad(planFinalBytes)

	var finished func()
	watch := b.connect(t)
	sub, err := watch.Subscribe("bench.plan.events.*.finished", func(m *nats.Msg) {
		var ev struct {
			State messages.State `json:"state"`
		}
		if json.Unmarshal(m.Data, &ev) == nil && ev.State == messages.StateSucceeded {
			finished()
		}
	})
	require.NoError(t, err)
	require.NoError(t, sub.SetPendingLimits(-1, -1))
	require.NoError(t, watch.Flush())

	var ids atomic.Int64
	return pulledLoop(t, b.label+" raw run plan", "run", n, cons,
		func() error {
			id := fmt.Sprintf("run%09d", ids.Add(1))
			msg := nats.NewMsg("bench.plan.runs")
			msg.Data = request
			msg.Header.Set(headerRun, id)
			_, err = pubJS.PublishMsg(ctx, msg, jetstream.WithMsgID(id))
			return err
		},
		func(ctx context.Context, m jetstream.Msg) error {
			return runPlan(ctx, subJS, subStates, m, queued, running, started, final, finishedDoc)
		}, &finished)
}

// runPlan is a puller's part of one bare run plan for request m: queued
// state (created), running state, started event (PubAck not awaited),
// final state, finished event, ack; the events with a run's headers.
func runPlan(ctx context.Context, js jetstream.JetStream, states jetstream.KeyValue, m jetstream.Msg, queued, running, started, final, finished []byte) error {
	id := m.Headers().Get(headerRun)
	rev, err := states.Create(ctx, id, queued)
	if err != nil {
		return fmt.Errorf("queued state: %w", err)
	}
	if rev, err = states.Update(ctx, id, running, rev); err != nil {
		return fmt.Errorf("running state: %w", err)
	}
	event := func(kind string, data []byte) *nats.Msg {
		e := nats.NewMsg("bench.plan.events." + id + "." + kind)
		e.Data = data
		e.Header.Set(messages.HeaderRunID, id)
		e.Header.Set(messages.HeaderAttempt, "1")
		e.Header.Set(jetstream.MsgIDHeader, "ev-"+id+"-1-"+kind)
		return e
	}
	if _, err := js.PublishMsgAsync(event("started", started)); err != nil {
		return fmt.Errorf("started event: %w", err)
	}
	if _, err := states.Update(ctx, id, final, rev); err != nil {
		return fmt.Errorf("final state: %w", err)
	}
	if _, err := js.PublishMsg(ctx, event("finished", finished)); err != nil {
		return fmt.Errorf("finished event: %w", err)
	}
	return m.Ack()
}
