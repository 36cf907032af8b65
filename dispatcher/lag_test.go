package dispatcher

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// Following a run survives a consumer that delivers
// nothing for a while (as one placed on a node still catching up): when the
// run's state is final but its events were not read yet, Watch reads them
// from the stream rather than saying the finished event is gone.
func TestWatchSurvivesALaggingConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const id = "lag1"
	var (
		mu   sync.Mutex
		seen []WatchEvent
	)
	type result struct {
		ev  messages.Event
		err error
	}
	done := make(chan result, 1)
	go func() {
		ev, err := b.d.Watch(t.Context(), id, func(ev WatchEvent) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, ev)
			return nil
		})
		done <- result{ev, err}
	}()
	// Pause the watch's consumer: it stands for one on a lagging replica.
	events, err := b.js.Stream(t.Context(), messages.StreamEvents)
	require.NoError(t, err)
	var name string
	require.Eventually(t, func() bool {
		for n := range events.ConsumerNames(t.Context()).Name() {
			name = n
		}
		return name != ""
	}, 5*time.Second, 10*time.Millisecond)
	_, err = b.js.PauseConsumer(t.Context(), messages.StreamEvents, name, time.Now().Add(time.Minute))
	require.NoError(t, err)

	now := time.Now().UTC()
	b.publishEvent(t, messages.Event{RunID: id, Type: messages.EventStarted, Attempt: 1, Time: now})
	b.publishOutput(t, id, messages.StreamStdout, 0, "after-restart-2\n")
	code := 0
	b.publishEvent(t, messages.Event{RunID: id, Type: messages.EventFinished, Attempt: 1, State: messages.StateSucceeded, ExitCode: &code, Time: now.Add(time.Millisecond)})
	kv, err := b.js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	data, err := json.Marshal(messages.RunState{Version: 1, ID: id, State: messages.StateSucceeded, ExitCode: &code, Attempts: 1,
		StartedAt: now, FinishedAt: now, UpdatedAt: now})
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), id, data)
	require.NoError(t, err)

	var r result
	select {
	case r = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("watch did not end")
	}
	require.NoError(t, r.err)
	mu.Lock()
	defer mu.Unlock()
	var out string
	fromState := false
	for _, ev := range seen {
		if ev.Type == messages.EventOutput {
			out += string(ev.Data)
		}
		fromState = fromState || ev.FromState
	}
	require.False(t, fromState, "the finished event was not gone, only not read yet")
	require.Equal(t, "after-restart-2\n", out)
	require.Equal(t, messages.StateSucceeded, r.ev.State)
}
