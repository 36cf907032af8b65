package dispatcher

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// relay makes a stream republish what is published to src onto dest, as
// someone allowed to configure streams could (package roles allows only
// workers), and publishes body through it.
func (b *testBundle) relay(t *testing.T, name, dest string, body any) {
	t.Helper()
	src := "relay." + name
	_, err := b.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: name, Subjects: []string{src},
		RePublish: &jetstream.RePublish{Source: src, Destination: dest}})
	require.NoError(t, err)
	data, err := json.Marshal(body)
	require.NoError(t, err)
	_, err = b.js.Publish(t.Context(), src, data)
	require.NoError(t, err)
}

// What submit --wait and status read of a run is what workers wrote: a
// state or a finished event the server relayed into the run's subjects (a
// stream's RePublish) is passed over, so a run that fails is never reported
// succeeded.
func TestWatchRefusesRelayedStatesAndEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const id = "relayed"
	kv, err := b.js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	put := func(st messages.RunState) {
		t.Helper()
		data, err := json.Marshal(st)
		require.NoError(t, err)
		_, err = kv.Put(t.Context(), id, data)
		require.NoError(t, err)
	}
	put(messages.RunState{Version: messages.StateVersion, ID: id, State: messages.StateRunning, Attempts: 1})
	b.publishEvent(t, messages.Event{RunID: id, Type: messages.EventStarted, Attempt: 1})

	type result struct {
		ev  messages.Event
		err error
	}
	res := make(chan result, 1)
	go func() {
		ev, err := b.d.Watch(t.Context(), id, nil)
		res <- result{ev, err}
	}()
	// Follow (the console's run page) passes over the relayed event too.
	followed := make(chan messages.Event, 16)
	go func() {
		_ = b.d.Follow(t.Context(), []string{messages.SubjectEventsAll(id)}, func(ev WatchEvent) error {
			followed <- ev.Event
			return nil
		})
	}()

	now := time.Now().UTC()
	b.relay(t, "RELAY_STATE", "$KV."+messages.BucketRuns+"."+id, messages.RunState{Version: messages.StateVersion, ID: id,
		State: messages.StateSucceeded, ExitCode: intPtr(0), Attempts: 1, FinishedAt: now})
	b.relay(t, "RELAY_EVENT", messages.SubjectEvents(id, messages.EventFinished), messages.Event{RunID: id,
		Type: messages.EventFinished, State: messages.StateSucceeded, ExitCode: intPtr(0), Attempt: 1, Time: now})
	require.Eventually(t, func() bool { return b.state(t, id).State == messages.StateSucceeded }, 5*time.Second, 10*time.Millisecond,
		"the relayed state is the bucket's newest")

	st, err := b.d.Status(t.Context(), id)
	require.NoError(t, err)
	require.Equal(t, messages.StateRunning, st.State, "status reads the worker's record")
	require.Never(t, func() bool { return len(res) > 0 }, 5*b.d.finishedGrace, 20*time.Millisecond,
		"watch ended on a relayed state or event")

	// The worker records the run's real end.
	put(messages.RunState{Version: messages.StateVersion, ID: id, State: messages.StateFailed, ExitCode: intPtr(3),
		Attempts: 1, FinishedAt: time.Now().UTC()})
	b.publishEvent(t, messages.Event{RunID: id, Type: messages.EventFinished, State: messages.StateFailed, ExitCode: intPtr(3),
		Attempt: 1, Time: time.Now().UTC()})
	r := <-res
	require.NoError(t, r.err)
	require.Equal(t, messages.StateFailed, r.ev.State)
	require.Equal(t, 3, *r.ev.ExitCode)
	for ev := range followed {
		require.NotEqual(t, messages.StateSucceeded, ev.State, "Follow passed on the relayed finished event")
		if ev.State == messages.StateFailed {
			break
		}
	}
}

// WatchRuns (the console's runs) reports what workers wrote: a run whose
// newest record was relayed shows the newest a worker wrote, and a relayed
// change is passed over.
func TestWatchRunsRefusesRelayedRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	kv, err := b.js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	put := func(id string, state messages.State) {
		t.Helper()
		data, err := json.Marshal(messages.RunState{Version: messages.StateVersion, ID: id, State: state})
		require.NoError(t, err)
		_, err = kv.Put(t.Context(), id, data)
		require.NoError(t, err)
	}
	forged := func(id string) messages.RunState {
		return messages.RunState{Version: messages.StateVersion, ID: id, State: messages.StateSucceeded, ExitCode: intPtr(0)}
	}
	put("r1", messages.StateRunning)
	b.relay(t, "RELAY_R1", "$KV."+messages.BucketRuns+".r1", forged("r1"))
	b.relay(t, "RELAY_R2", "$KV."+messages.BucketRuns+".r2", forged("r2"))
	require.Eventually(t, func() bool {
		_, err1 := kv.Get(t.Context(), "r2")
		return b.state(t, "r1").State == messages.StateSucceeded && err1 == nil
	}, 5*time.Second, 10*time.Millisecond)

	updates := make(chan RunUpdate, 16)
	go func() { _ = b.d.WatchRuns(t.Context(), func(u RunUpdate) { updates <- u }) }()
	next := func() RunUpdate {
		t.Helper()
		select {
		case u := <-updates:
			return u
		case <-time.After(5 * time.Second):
			t.Fatal("no update")
			return RunUpdate{}
		}
	}
	u := next()
	require.Equal(t, "r1", u.ID)
	require.Equal(t, messages.StateRunning, u.State.State, "the worker's record, not the relayed one")
	require.True(t, next().Synced, "r2 has no worker's record: no run")

	// Live: a relayed change is passed over, a worker's is not.
	b.relay(t, "RELAY_R1_AGAIN", "$KV."+messages.BucketRuns+".r1", forged("r1"))
	put("r1", messages.StateFailed)
	u = next()
	require.Equal(t, "r1", u.ID)
	require.Equal(t, messages.StateFailed, u.State.State)
}
