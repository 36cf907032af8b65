package dispatcher

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
)

func TestRunFilterMatch(t *testing.T) {
	t.Parallel()
	st := messages.RunState{ID: "01ABC", State: messages.StateFailed, Pool: "gpu", Profile: "claude", Group: "g",
		Labels: map[string]string{"team": "a", "pr": "7"}, Reason: "exit code 3: Build Broke"}
	for _, tc := range []struct {
		f    RunFilter
		want bool
	}{
		{RunFilter{}, true},
		{RunFilter{State: messages.StateFailed, Pool: "gpu", Profile: "claude", Group: "g"}, true},
		{RunFilter{State: messages.StateSucceeded}, false},
		{RunFilter{Pool: "cpu"}, false},
		{RunFilter{Profile: "shell"}, false},
		{RunFilter{Group: "h"}, false},
		{RunFilter{Labels: map[string]string{"team": "a", "pr": "7"}}, true},
		{RunFilter{Labels: map[string]string{"team": "b"}}, false},
		{RunFilter{Labels: map[string]string{"missing": ""}}, false},
		{RunFilter{Search: "01a"}, true},
		{RunFilter{Search: "1AB"}, true},
		{RunFilter{Search: "02"}, false},
		{RunFilter{Search: "TEAM=A"}, true},
		{RunFilter{Search: "pr=7"}, true},
		{RunFilter{Search: "build broke"}, true},
		{RunFilter{Search: "exit code 4"}, false},
		{RunFilter{Search: "g"}, true},
		{RunFilter{State: AnyFailure}, true},
		{RunFilter{State: AnyFailure, Search: "nope"}, false},
	} {
		require.Equal(t, tc.want, tc.f.Match(&st), "%+v", tc.f)
	}
	for s, want := range map[messages.State]bool{
		messages.StateFailed: true, messages.StateTimedOut: true, messages.StateStalled: true,
		messages.StateSucceeded: false, messages.StateCancelled: false, messages.StateRunning: false, messages.StateQueued: false,
	} {
		st := messages.RunState{ID: "x", State: s}
		require.Equal(t, want, RunFilter{State: AnyFailure}.Match(&st), "state %s", s)
	}
}

// TestNewerReplayed: a replayed run is listed by its latest activity, the
// start of its replay, not the first submit's queue time it keeps.
func TestNewerReplayed(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	old := messages.RunState{ID: "01A", QueuedAt: t0, StartedAt: t0.Add(time.Hour), Replays: 1}
	mid := messages.RunState{ID: "01B", QueuedAt: t0.Add(time.Minute), StartedAt: t0.Add(2 * time.Minute)}
	require.Negative(t, Newer(&old, &mid), "the replayed run, started an hour later, comes first")
	old.Replays = 0
	require.Positive(t, Newer(&old, &mid), "without a replay the queue time orders")
}

func TestRunsAndWatchRuns(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	runs, err := b.d.Runs(t.Context(), RunFilter{})
	require.NoError(t, err, "an empty bucket lists nothing, at once")
	require.Empty(t, runs)

	// The states a worker records (Submit writes none).
	kv, err := b.js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	base := time.Now().UTC()
	for i, st := range []messages.RunState{
		{ID: "r1", Profile: "shell", Pool: "default", Labels: map[string]string{"k": "v"}},
		{ID: "r2", Profile: "shell", Pool: "other"},
		{ID: "r3", Profile: "shell", Pool: "default", Labels: map[string]string{"k": "v"}},
	} {
		st.State, st.QueuedAt = messages.StateQueued, base.Add(time.Duration(i)*time.Millisecond)
		data, _ := json.Marshal(st)
		_, err := kv.Put(t.Context(), st.ID, data)
		require.NoError(t, err)
	}
	runs, err = b.d.Runs(t.Context(), RunFilter{Labels: map[string]string{"k": "v"}})
	require.NoError(t, err)
	require.Len(t, runs, 2)
	require.Equal(t, "r3", runs[0].ID, "newest first")
	require.Equal(t, "r1", runs[1].ID)

	// WatchRuns: the stored states, the marker, then live changes.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var got []RunUpdate
	done := make(chan error, 1)
	go func() {
		done <- b.d.WatchRuns(ctx, func(u RunUpdate) {
			got = append(got, u)
			if u.ID == "r4" {
				cancel()
			}
			if u.Synced {
				st, _ := json.Marshal(messages.RunState{ID: "r4", State: messages.StateQueued})
				_, _ = kv.Put(ctx, "r4", st)
			}
		})
	}()
	require.NoError(t, <-done)
	require.Len(t, got, 5)
	require.True(t, got[3].Synced)
	require.Equal(t, "r4", got[4].ID)
}

func TestRunsNotProvisioned(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noProvision: true})
	_, err := b.d.Runs(t.Context(), RunFilter{})
	require.ErrorIs(t, err, ErrNotProvisioned)
	_, err = b.d.Pools(t.Context())
	require.ErrorIs(t, err, ErrNotProvisioned)
	_, err = b.d.Workers(t.Context())
	require.ErrorIs(t, err, ErrNotProvisioned)
}

func TestPoolsAndWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := worker.Provision(t.Context(), b.js, worker.ProvisionConfig{Pool: "gpu", MaxAckPending: 7})
	require.NoError(t, err)
	_, err = b.d.Submit(t.Context(), messages.RunRequest{ID: "q1", Profile: "shell", Pool: "gpu"})
	require.NoError(t, err)
	pools, err := b.d.Pools(t.Context())
	require.NoError(t, err)
	require.Len(t, pools, 2)
	require.Equal(t, "default", pools[0].Pool)
	require.Equal(t, PoolStats{Pool: "gpu", Queued: 1, MaxAckPending: 7}, pools[1])

	kv, err := b.js.KeyValue(t.Context(), messages.BucketWorkers)
	require.NoError(t, err)
	beat := time.Now().UTC().Truncate(time.Millisecond)
	_, err = kv.Put(t.Context(), "w2", []byte(beat.Format(time.RFC3339Nano)))
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), "w1", []byte("not a time"))
	require.NoError(t, err)
	// A worker's value is its presence (worker/presence.go): pool,
	// concurrency and warm pools come from it, the beat from its time.
	warm := []messages.WarmPool{{Profile: "hot", Target: 2, Ready: 1}, {Profile: "shell", Target: 1, Error: "image not found"}}
	p, err := json.Marshal(messages.WorkerPresence{Worker: "w3", Pool: "gpu", Concurrency: 4, Time: beat, Warm: warm})
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), "w3", p)
	require.NoError(t, err)
	ws, err := b.d.Workers(t.Context())
	require.NoError(t, err)
	w3 := WorkerBeat{ID: "w3", Beat: beat, Pool: "gpu", Concurrency: 4, Warm: warm}
	require.Equal(t, []WorkerBeat{{ID: "w1"}, {ID: "w2", Beat: beat}, w3}, ws,
		"an older worker's bare time gives the beat alone; an unreadable value, the id alone")
	require.Equal(t, messages.WorkerPresence{Worker: "w3", Pool: "gpu", Concurrency: 4, Time: beat, Warm: warm}, w3.Presence())
}

func TestFollow(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.publishEvent(t, messages.Event{RunID: "f1", Type: messages.EventStarted, Attempt: 1})
	b.publishOutput(t, "f1", messages.StreamStdout, 0, "hello")
	b.publishEvent(t, messages.Event{RunID: "f2", Type: messages.EventStarted, Attempt: 1})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var got []WatchEvent
	err := b.d.Follow(ctx, []string{messages.SubjectEventsAll("f1")}, func(ev WatchEvent) error {
		got = append(got, ev)
		if len(got) == 2 {
			// A finished event does not end Follow: it goes on live.
			b.publishEvent(t, messages.Event{RunID: "f1", Type: messages.EventFinished, State: messages.StateSucceeded})
		}
		if len(got) == 3 {
			cancel()
		}
		return nil
	})
	require.NoError(t, err)
	require.Len(t, got, 3)
	require.Equal(t, messages.EventOutput, got[1].Type)
	require.Equal(t, "hello", string(got[1].Data))
	require.Equal(t, messages.EventFinished, got[2].Type)
	require.Error(t, b.d.Follow(t.Context(), nil, nil), "no filter")
}

// A dead letter says what became of its run; a healed one is resolved.
func TestFateOf(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		st       messages.State
		ok, wait bool
		fate     Fate
	}{
		{messages.StateFailed, true, false, FateFailing},
		{messages.StateTimedOut, true, false, FateFailing},
		{"", false, false, FateFailing},
		{messages.StateFailed, true, true, FateReplaying},
		{messages.StateRunning, true, false, FateReplaying},
		{messages.StateQueued, true, false, FateReplaying},
		{messages.StateSucceeded, true, false, FateHealed},
		{messages.StateSucceeded, true, true, FateHealed}, // the healing replay, not yet acked
		{messages.StateCancelled, true, false, FateCancelled},
	} {
		fate := FateOf(messages.RunState{State: tc.st}, tc.ok, tc.wait)
		require.Equal(t, tc.fate, fate, "%+v", tc)
		require.Equal(t, tc.fate == FateHealed, fate.Resolved(), "%+v", tc)
	}
}
