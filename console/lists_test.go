package console

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// Issue 27, lists: the runs list searches id, group, labels and reason
// whatever their case; "any failure" selects failed, timed out and stalled
// runs; a label chip filters by its label; the pager says where it is and
// goes back to newer runs; a replayed run sorts by its latest activity; a
// run without a group shows "-".
func TestRunsSearchAndPager(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	base := time.Now().Add(-time.Hour).UTC()
	var states []messages.RunState
	for i := range 120 {
		st := messages.RunState{Version: 1, ID: fmt.Sprintf("run-%03d", i), State: messages.StateSucceeded, Profile: "shell",
			Pool: "default", Group: fmt.Sprintf("run-%03d", i), Labels: map[string]string{"team": []string{"Docs", "infra"}[i%2]},
			QueuedAt: base.Add(time.Duration(i) * time.Second), UpdatedAt: base}
		switch i % 10 {
		case 1:
			st.State, st.Reason = messages.StateFailed, "exit code 3: Disk Full"
		case 2:
			st.State, st.Reason = messages.StateTimedOut, "timed out after 1m"
		case 3:
			st.State, st.Reason = messages.StateStalled, "stalled"
		case 4:
			st.State, st.Reason = messages.StateCancelled, "cancelled"
		case 5:
			st.Group = "crew-Blue"
		}
		states = append(states, st)
	}
	// run-000, the oldest, was replayed a moment ago: it is listed first.
	states[0].Replays, states[0].StartedAt = 1, base.Add(10*time.Minute)
	b.putStates(t, states...)
	require.Eventually(t, func() bool { _, ok := b.c.cache.get("run-000"); return ok }, 15*time.Second, 10*time.Millisecond)

	for _, tc := range []struct {
		query string
		n     int
	}{
		{"q=DISK+full", 12},                      // reason, any case
		{"q=team%3Ddocs", 60},                    // a label as k=v, any case
		{"q=crew-blue", 12},                      // group
		{"q=RUN-11", 10},                         // id substring: run-110..119
		{"state=failure", 36},                    // failed, timed out, stalled
		{"state=failure&q=stalled", 12},          // both
		{"state=failure&label=team%3Dinfra", 24}, // i%10 in 1,3 odd: 24
	} {
		_, body := b.get(t, "/runs?"+tc.query)
		require.Contains(t, body, fmt.Sprintf(`id="total">%d run(s)`, tc.n), tc.query)
	}
	_, body := b.get(t, "/runs?state=failure")
	require.Contains(t, body, `<option value="failure" selected>any failure</option>`)

	_, page1 := b.get(t, "/runs")
	require.Contains(t, page1, `id="position">1–50 of 120`)
	rows := strings.Split(page1, `<tr data-id="`)
	require.True(t, strings.HasPrefix(rows[1], `run-000"`), "the replayed run sorts by its replay, first")
	require.True(t, strings.HasPrefix(rows[2], `run-119"`))
	require.Contains(t, page1, `<a class="label" href="/runs?label=team%3Dinfra" title="only runs with this label">team=infra</a>`, "a label chip filters")
	require.NotContains(t, page1, `href="/groups/default/run-119"`, "a run without a group links none")
	require.Contains(t, page1, `<a href="/groups/default/crew-Blue">`)
	require.Empty(t, hrefOf(page1, "newer"), "the first page has no newer page")

	_, page2 := b.get(t, hrefOf(page1, "next"))
	require.Contains(t, page2, `id="position">51–100 of 120`)
	_, page3 := b.get(t, hrefOf(page2, "next"))
	require.Contains(t, page3, `id="position">101–120 of 120`)
	require.Empty(t, hrefOf(page3, "next"))
	_, back := b.get(t, hrefOf(page3, "newer"))
	require.Contains(t, back, `id="position">51–100 of 120`, "newer goes back one page")
	_, first := b.get(t, hrefOf(page3, "first"))
	require.Contains(t, first, `id="position">1–50 of 120`)

	// A label chip keeps the other filters.
	_, failures := b.get(t, "/runs?state=failure")
	require.Contains(t, failures, `href="/runs?label=team%3Dinfra&amp;state=failure"`)
}
