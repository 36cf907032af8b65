package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// Issue 27: the runs list offers Cancel on each run not ended (running or
// queued), behind a confirmation, and returns to the list; a read-only
// console offers none and refuses the POST; a form's back never leads off
// the runs pages.
func TestRunsListCancel(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	id := b.submit(t, messages.RunRequest{Prompt: "sleep 1h"})
	b.waitState(t, id, messages.StateRunning)
	now := time.Now().UTC()
	b.putStates(t, messages.RunState{ID: "done-1", State: messages.StateSucceeded, Pool: "default", Profile: "shell", QueuedAt: now, UpdatedAt: now})

	_, body := b.get(t, "/runs?pool=default")
	row := between(body, `<tr data-id="`+id+`"`, "</tr>")
	require.Contains(t, row, `<button type="submit" form="row-cancel" formaction="/runs/`+id+`/cancel" class="cancel-one" data-run="`+id+`">Cancel…</button>`)
	require.NotContains(t, between(body, `<tr data-id="done-1"`, "</tr>"), "cancel-one", "no cancel for an ended run")
	require.Contains(t, body, `<form method="post" id="row-cancel" hidden><input type="hidden" name="csrf" value="`+b.c.core.csrf+`"><input type="hidden" name="back" value="/runs?pool=default"></form>`,
		"one form the rows' buttons post, with the token and the way back")

	// The form asks first, then cancels and goes back to the list.
	resp, body := b.post(t, "/runs/"+id+"/cancel", url.Values{"csrf": {b.c.core.csrf}, "back": {"/runs?pool=default"}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, `<input type="hidden" name="back" value="/runs?pool=default">`)
	require.Contains(t, body, `<a href="/runs?pool=default" id="keep">Keep it</a>`)
	require.Equal(t, messages.StateRunning, b.waitState(t, id, messages.StateRunning).State, "asking cancels nothing")
	for _, bad := range []string{"//evil.example/runs", "https://evil.example/", "/dead-letters/discard", "/runs/a/b", "/runs/x#y"} {
		require.Equal(t, "/runs/"+id, localBack(bad, "/runs/"+id), bad)
	}
	resp, _ = b.post(t, "/runs/"+id+"/cancel", url.Values{"csrf": {b.c.core.csrf}, "confirm": {"yes"}, "back": {"/runs?pool=default"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "/runs?pool=default", resp.Header.Get("Location"))
	b.waitState(t, id, messages.StateCancelled)

	// Read only: no Cancel, and the POST refused.
	ro := setup(t, setupOpts{readOnly: true})
	rid := ro.submit(t, messages.RunRequest{Prompt: "sleep 1h"})
	ro.waitState(t, rid, messages.StateRunning)
	_, body = ro.get(t, "/runs")
	require.Contains(t, body, `<tr data-id="`+rid+`"`)
	require.NotContains(t, body, "cancel-one")
	require.NotContains(t, body, "row-cancel")
	resp, _ = ro.post(t, "/runs/"+rid+"/cancel", url.Values{"csrf": {ro.c.core.csrf}, "confirm": {"yes"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
}

// TestBrowserRunsListCancelAndReplay drives the runs list in chromium: a
// run submitted while it is open comes with its Cancel, which asks for a
// confirmation, cancels and returns to the list; a run replayed while the
// list is open moves to its top (its latest activity), without a reload.
func TestBrowserRunsListCancelAndReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, exceptions := browser(t)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	old := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	failed := messages.RunState{ID: "old-failed", State: messages.StateFailed, Reason: "exit code 1", Pool: "default", Profile: "shell", Attempts: 1,
		QueuedAt: old, StartedAt: old.Add(time.Second), FinishedAt: old.Add(2 * time.Second), UpdatedAt: old.Add(2 * time.Second)}
	b.putStates(t, failed, messages.RunState{ID: "newer-ok", State: messages.StateSucceeded, Pool: "default", Profile: "shell",
		QueuedAt: old.Add(time.Minute), UpdatedAt: old.Add(time.Minute)})

	rows := `[...document.querySelectorAll("#runs tr[data-id]")].map(r => r.dataset.id).join(",")`
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.srv.URL+"/runs")))
	poll(t, ctx, 15*time.Second, `document.getElementById("live")?.classList.contains("on")`, "the list's live stream opens")
	poll(t, ctx, 5*time.Second, fmt.Sprintf(`%s === "newer-ok,old-failed"`, rows), "newest first")
	id := b.submit(t, messages.RunRequest{Prompt: "out hi;sleep 1h"})
	b.waitState(t, id, messages.StateRunning)
	poll(t, ctx, 10*time.Second, `document.querySelector('#runs tr[data-id="`+id+`"] button.cancel-one') !== null`, "the new run comes with its Cancel")
	click(t, ctx, chromedp.CSS(`button.cancel-one[data-run="`+id+`"]`))
	poll(t, ctx, 5*time.Second, `document.getElementById("confirm") !== null`, "Cancel asks for a confirmation")
	click(t, ctx, chromedp.ID("confirm"))
	poll(t, ctx, 10*time.Second, `location.pathname === "/runs" &&
		document.querySelector('#runs tr[data-id="`+id+`"] .badge')?.textContent === "cancelled" &&
		document.querySelector('#runs tr[data-id="`+id+`"] button.cancel-one') === null`, "back on the list, the run cancelled, no Cancel left")
	b.waitState(t, id, messages.StateCancelled)

	// old-failed is replayed: its latest activity moves it to the top.
	poll(t, ctx, 15*time.Second, `document.getElementById("live")?.classList.contains("on")`, "the list's live stream opens")
	poll(t, ctx, 5*time.Second, fmt.Sprintf(`%s.endsWith(",old-failed")`, rows), "the failed run at the bottom")
	now := time.Now().UTC()
	failed.State, failed.Replays, failed.Attempts, failed.Reason = messages.StateRunning, 1, 2, ""
	failed.StartedAt, failed.FinishedAt, failed.UpdatedAt = now, time.Time{}, now
	b.putStates(t, failed)
	poll(t, ctx, 10*time.Second, fmt.Sprintf(`%s.startsWith("old-failed,")`, rows), "the replayed run moves to the top, live")
	require.Empty(t, exceptions(), "no JavaScript error")
}
