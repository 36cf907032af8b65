package console

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// TestBrowserRunChanges drives a workspace run's page in headless
// chromium: its times say "2 min ago" with the absolute time and zone on
// hover and its run time counts on; when the run ends with the page open,
// its changes arrive without a reload: commits, diffstat, the patch as
// text (hostile lines inert), the apply command to copy.
func TestBrowserRunChanges(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, exceptions := browser(t)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	q := time.Now().UTC().Add(-2*time.Minute - 5*time.Second).Truncate(time.Millisecond)
	st := messages.RunState{ID: "ws-br", State: messages.StateRunning, Pool: "default", Profile: "shell", Worker: "w-1",
		Attempts: 1, QueuedAt: q, StartedAt: q.Add(5 * time.Second), UpdatedAt: q.Add(5 * time.Second)}
	b.putStates(t, st)

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.srv.URL+"/runs/ws-br")))
	poll(t, ctx, 15*time.Second, `document.getElementById("live")?.classList.contains("on")`, "the run page's live stream opens")
	poll(t, ctx, 5*time.Second, `document.querySelector("#queued time")?.textContent === "2 min ago" &&
		document.querySelector("#queued time").title.endsWith("`+clock(q)+` UTC")`, "queued 2 min ago, the absolute time on hover")
	before, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#ran .dur").textContent`))
	require.NoError(t, err)
	poll(t, ctx, 5*time.Second, `document.querySelector("#ran .dur").textContent !== "`+before+`"`, "its run time counts on")
	hidden, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("changes").hidden`))
	require.NoError(t, err)
	require.True(t, hidden, "no changes section before the run ends")

	// It ends with the page open: its changes come without a reload.
	st.State, st.FinishedAt, st.UpdatedAt = messages.StateSucceeded, q.Add(65*time.Second), q.Add(65*time.Second)
	st.WorkspaceResult = resultFixture(t, b.js, "ws-br", map[string][]byte{messages.ResultPatch: []byte(hostilePatch), messages.ResultBundle: []byte("b")})
	b.putStates(t, st)
	poll(t, ctx, 10*time.Second, `document.getElementById("patch")?.textContent.includes("+// <script>window.pwned=1</script>")`, "the patch arrives, as text")
	inert, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.pwned === undefined &&
		document.querySelectorAll("main script, main img").length === 0 &&
		document.querySelectorAll("#patch span.add").length === 3 && document.querySelectorAll("#patch span.del").length === 1 &&
		document.getElementById("patch").textContent.includes("␛[31mred<U+202E>") &&
		document.getElementById("diffstat").textContent === "2 files changed, 3 insertions(+), 1 deletion(-)" &&
		document.getElementById("cmd-apply").textContent === "jetcrew apply ws-br" &&
		document.querySelector("#ran .dur").textContent === "1m0s" && !document.querySelector("#ran .dur").dataset.from`))
	require.NoError(t, err)
	require.True(t, inert, "the patch is inert text, classed by line; the run time stopped at 1m0s")
	click(t, ctx, chromedp.CSS(`button[data-copy="cmd-apply"]`))
	poll(t, ctx, 5*time.Second, `["Copied", "Select and copy"].includes(document.querySelector('button[data-copy="cmd-apply"]').textContent)`, "the copy button answers")
	shot(t, ctx, "run-changes")
	require.Empty(t, exceptions(), "no JavaScript error")
}
