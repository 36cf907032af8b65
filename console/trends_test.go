package console

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

func TestTrendBuckets(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 1, 10, 7, 30, 0, time.UTC)
	tr := newTrend(trendSpecs[0], now)
	require.Equal(t, time.Date(2025, 3, 1, 9, 10, 0, 0, time.UTC), tr.Buckets[0].Start, "12 buckets of 5 min, the last holding now")
	require.Equal(t, time.Date(2025, 3, 1, 10, 5, 0, 0, time.UTC), tr.Buckets[11].Start)
	for _, c := range []struct {
		at   time.Time
		want int // -1: outside
	}{
		{now, 11},
		{time.Date(2025, 3, 1, 10, 5, 0, 0, time.UTC), 11},
		{time.Date(2025, 3, 1, 10, 4, 59, 0, time.UTC), 10},
		{time.Date(2025, 3, 1, 9, 10, 0, 0, time.UTC), 0},
		{time.Date(2025, 3, 1, 9, 9, 59, 0, time.UTC), -1},
		{time.Date(2025, 3, 1, 10, 10, 0, 0, time.UTC), -1},
		{time.Time{}, -1},
	} {
		b := tr.bucket(c.at)
		if c.want < 0 {
			require.Nil(t, b, "%s", c.at)
			continue
		}
		require.Same(t, &tr.Buckets[c.want], b, "%s", c.at)
	}

	at := func(m int) time.Time { return now.Add(-time.Duration(m) * time.Minute) }
	for i, st := range []messages.RunState{
		// now is 10:07:30: bucket 11 is [10:05, 10:10), 10 [10:00, 10:05), 9 [9:55, 10:00), 7 [9:45, 9:50).
		{State: messages.StateSucceeded, QueuedAt: at(2), StartedAt: at(2).Add(time.Second), FinishedAt: at(1)},
		{State: messages.StateFailed, QueuedAt: at(2), StartedAt: at(2).Add(3 * time.Second), FinishedAt: at(1)},
		{State: messages.StateTimedOut, QueuedAt: at(20), StartedAt: at(20).Add(time.Minute), FinishedAt: at(5)},
		{State: messages.StateRunning, QueuedAt: at(40), StartedAt: at(40).Add(time.Hour / 2)}, // a wait beyond the histogram
		{State: messages.StateCancelled, QueuedAt: at(200), FinishedAt: at(200)},               // before the window
	} {
		st.ID = fmt.Sprint(i)
		tr.add(&st)
	}
	last := tr.Buckets[11]
	require.Equal(t, 2, last.Finished)
	require.Equal(t, 1, last.Failed)
	require.Equal(t, 2, last.Started)
	require.Equal(t, 1, tr.Buckets[10].Failed, "a timeout is a failure")
	require.Equal(t, 1, tr.Buckets[7].Started)
	require.Equal(t, 1, tr.Buckets[9].Waits[len(waitBounds)], "a 30 min wait is above the last bound")

	v := tr.view()
	require.Equal(t, "3 run(s) finished, 2 of them failed, timed out or stalled", v.Runs.Desc)
	require.Equal(t, "4 run(s) started; queue wait p50 5.1s, p90 > 10m55s", v.Waits.Desc)
	require.Equal(t, "Runs finished, last hour, per 5 minutes", v.Runs.Title)
	require.Len(t, v.Runs.Bars, 3, "bucket 11 has a success and a failure segment, bucket 10 a failure")
	for _, b := range v.Runs.Bars {
		require.GreaterOrEqual(t, b.Y, 0.0)
		require.LessOrEqual(t, b.Y+b.H, float64(chartHeight)+1e-9)
	}
}

func TestQuantile(t *testing.T) {
	t.Parallel()
	var h [len(waitBounds) + 1]int
	_, _, ok := quantile(&h, 0, 0.5)
	require.False(t, ok)
	require.Equal(t, "-", waitText(quantile(&h, 0, 0.5)))
	// 10 waits of 1 s: all in the bucket (0.64, 1.28].
	h[waitIndex(1)] = 10
	q, over, ok := quantile(&h, 10, 0.5)
	require.True(t, ok)
	require.False(t, over)
	require.InDelta(t, 0.96, q, 1e-9, "linear inside the bucket, as histogram_quantile")
	h[len(waitBounds)] = 90
	require.True(t, func() bool { _, over, _ := quantile(&h, 100, 0.9); return over }())
	require.Equal(t, "> 10m55s", waitText(quantile(&h, 100, 0.9)))
}

// The overview draws the charts of the runs' states, updates them from
// the same fragment the live stream fetches, and shows the first-run
// hint only while there is no run.
func TestOverviewTrendsAndFirstRun(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, body := b.get(t, "/")
	require.Contains(t, body, `id="first-run"`)
	require.Contains(t, body, "jetcrew submit --profile shell")
	require.Contains(t, body, `0 run(s) finished, 0 of them failed`)
	require.NotContains(t, body, `id="nodes"`, "a single server shows no nodes")

	now := time.Now().UTC()
	var states []messages.RunState
	for i := range 6 {
		st := messages.RunState{Version: messages.StateVersion, ID: fmt.Sprintf("trend-%d", i), Pool: "default", Profile: "shell",
			State: messages.StateSucceeded, QueuedAt: now.Add(-10 * time.Minute), StartedAt: now.Add(-10*time.Minute + 2*time.Second),
			FinishedAt: now.Add(-9 * time.Minute), UpdatedAt: now}
		if i%3 == 0 {
			st.State = messages.StateFailed
		}
		states = append(states, st)
	}
	old := states[0]
	old.ID, old.QueuedAt, old.StartedAt, old.FinishedAt = "trend-old", now.Add(-5*time.Hour), now.Add(-5*time.Hour+time.Minute), now.Add(-5*time.Hour+2*time.Minute)
	b.putStates(t, append(states, old)...)

	_, body = b.get(t, "/overview/fragment")
	require.NotContains(t, body, `id="first-run"`)
	require.Contains(t, body, `<title id="chart-runs-hour-t">Runs finished, last hour, per 5 minutes</title>`)
	require.Contains(t, body, `<desc id="chart-runs-hour-d">6 run(s) finished, 2 of them failed, timed out or stalled</desc>`)
	require.Contains(t, body, `<desc id="chart-runs-day-d">7 run(s) finished, 3 of them failed, timed out or stalled</desc>`)
	require.Contains(t, body, `6 run(s) started; queue wait p50 1.9s`, "waits of 2 s, estimated in the (1.28, 2.56] bucket")
	require.Contains(t, body, `class="bar-fail"`)
	require.Contains(t, body, `role="img" aria-labelledby="chart-wait-day-t chart-wait-day-d"`)
}
