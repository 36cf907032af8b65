package console

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// Issue 27, bug 1: runs no worker has taken yet (their requests wait in
// JETCREW_RUNS; a submitter writes no state) show as queued runs in the
// list, with their place in the pool's queue; the overview says how long
// the oldest has waited; a queued run's page waits for a worker and turns
// live when one takes it; an operator can cancel it.
func TestQueuedRuns(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	// Pool busy has one worker with one slot, held by a long run: the
	// next two wait behind it.
	startWorker(t, b.nc, "busy", 1)
	hold := b.submit(t, messages.RunRequest{Pool: "busy", Prompt: "sleep 1h"})
	b.waitState(t, hold, messages.StateRunning)
	q1 := b.submit(t, messages.RunRequest{Pool: "busy", Prompt: "out one", Labels: map[string]string{"team": "docs"}})
	q2 := b.submit(t, messages.RunRequest{Pool: "busy", Prompt: "out two"})

	_, body := b.get(t, "/runs")
	for i, id := range []string{q1, q2} {
		row := between(body, `<tr data-id="`+id+`"`, "</tr>")
		require.NotEmpty(t, row, "run %s is listed", id)
		require.Contains(t, row, `<span class="badge state-queued">queued</span>`)
		require.Contains(t, row, "waiting for a worker: "+strconv.Itoa(i+1)+" in pool busy&#39;s queue")
		require.Contains(t, row, ">busy<")
	}
	require.Contains(t, between(body, `<tr data-id="`+q1+`"`, "</tr>"), "team=docs")
	_, body = b.get(t, "/runs?state=queued&pool=busy")
	require.Contains(t, body, `data-id="`+q1+`"`)
	require.NotContains(t, body, `data-id="`+hold+`"`)
	_, body = b.get(t, "/runs?label=team%3Ddocs")
	require.Contains(t, body, `data-id="`+q1+`"`)
	require.NotContains(t, body, `data-id="`+q2+`"`)

	// The overview's oldest queued run of pool busy.
	_, body = b.get(t, "/")
	row := between(body, `<a href="/runs?pool=busy">busy</a>`, "</tr>")
	require.NotEmpty(t, row)
	require.NotContains(t, row, "<td>-</td>", "the oldest queued run's age is shown")

	// A queued run's page: waiting, cancellable.
	code, body := b.get(t, "/runs/"+q2)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `id="waiting"`)
	require.Contains(t, body, `id="cancel-form"`)
	require.NotContains(t, between(body, `id="cancel-form"`, ">"), "hidden")
	resp, _ := b.post(t, "/runs/"+q2+"/cancel", url.Values{"csrf": {b.c.core.csrf}, "confirm": {"yes"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	b.waitState(t, q2, messages.StateCancelled)

	// Its page's live stream says when a worker takes it.
	code, body = b.get(t, "/runs/"+q1)
	require.Equal(t, http.StatusOK, code)
	rev := between(body, "/live/run/"+q1+"?rev=", `"`)
	stream := b.readSSEOpened(t, "/live/run/"+q1+"?rev="+rev, 15*time.Second, func() {
		_, err := b.d.Cancel(t.Context(), hold) // frees the slot
		require.NoError(t, err)
	}, func(s string) bool { return strings.Contains(s, "one") && strings.Contains(s, `"state":"succeeded"`) })
	require.Contains(t, stream, `"state":"running"`)

	// An id no request and no state knows is still not found.
	code, _ = b.get(t, "/runs/"+"nosuchrun")
	require.Equal(t, http.StatusNotFound, code)
}
