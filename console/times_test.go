package console

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

func TestRelTime(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		ago  time.Duration
		want string
	}{
		{-time.Minute, "just now"}, // another clock
		{0, "just now"},
		{9 * time.Second, "just now"},
		{42 * time.Second, "42 s ago"},
		{2*time.Minute + 59*time.Second, "2 min ago"},
		{3 * time.Hour, "3 h ago"},
		{49 * time.Hour, "2 d ago"},
	} {
		require.Equal(t, tc.want, relTime(now.Add(-tc.ago), now), "%s ago", tc.ago)
	}
	require.Equal(t, "-", relTime(time.Time{}, now))
}

// The queue wait ends at the start, or at the end of a run that never
// started; the run's time at its end; each goes on while it lasts.
func TestSpans(t *testing.T) {
	t.Parallel()
	q := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	now := q.Add(time.Hour)
	for _, tc := range []struct {
		name      string
		st        messages.RunState
		wait, ran string
	}{
		{"queued", messages.RunState{State: messages.StateQueued, QueuedAt: q}, "1h0m0s", "-"},
		{"running", messages.RunState{State: messages.StateRunning, QueuedAt: q, StartedAt: q.Add(1500 * time.Millisecond)}, "1s", "59m58s"},
		{"succeeded", messages.RunState{State: messages.StateSucceeded, QueuedAt: q, StartedAt: q.Add(2 * time.Second),
			FinishedAt: q.Add(2*time.Second + 250*time.Millisecond)}, "2s", "250ms"},
		{"cancelled while queued", messages.RunState{State: messages.StateCancelled, QueuedAt: q, FinishedAt: q.Add(5 * time.Second)}, "5s", "-"},
		{"no times", messages.RunState{State: messages.StateFailed}, "-", "-"},
	} {
		require.Equal(t, tc.wait, waitSpan(&tc.st).text(now), tc.name)
		require.Equal(t, tc.ran, runSpan(&tc.st).text(now), tc.name)
	}
}
