package console

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// TestBrowserGroupAttempts opens a group of three attempts in headless
// chromium: their comparison and two diffs side by side, hostile patch
// lines as text; the running third ends with a result while the page is
// open and its row and diff arrive without a reload; the apply command's
// copy button answers; the page fits a phone.
func TestBrowserGroupAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, exceptions := browser(t)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	runs := attemptsFixture(t, b, "gb")

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.srv.URL+"/groups/default/gb")))
	poll(t, ctx, 15*time.Second, `document.getElementById("live")?.classList.contains("on")`, "the group page's live stream opens")
	ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.pwned === undefined &&
		document.querySelectorAll("main script, main img").length === 0 &&
		document.querySelectorAll("article.attempt").length === 2 &&
		document.querySelector('article[data-run="gb-1"] pre.diff').textContent.includes("+// <script>window.pwned=1</script>") &&
		document.querySelectorAll('article[data-run="gb-1"] pre.diff span.add').length === 3 &&
		document.querySelector('article[data-run="gb-2"] .patch-cut') !== null &&
		(() => { const [a, b] = document.querySelectorAll("article.attempt"); return a.getBoundingClientRect().top === b.getBoundingClientRect().top; })()`))
	require.NoError(t, err)
	require.True(t, ok, "two attempts' diffs side by side, inert, the large one cut")

	// The third ends with the page open: its outcome and diff come.
	st := runs[2]
	st.State, st.FinishedAt, st.UpdatedAt, st.ExitCode = messages.StateSucceeded, st.StartedAt.Add(2*time.Second), st.StartedAt.Add(2*time.Second), new(0)
	st.WorkspaceResult = resultFixture(t, b.js, "gb-3", map[string][]byte{messages.ResultPatch: []byte(hostilePatch), messages.ResultBundle: []byte("b")})
	b.putStates(t, st)
	poll(t, ctx, 10*time.Second, `document.querySelectorAll("article.attempt").length === 3 &&
		document.querySelector('#runs tr[data-id="gb-3"] td:nth-child(6)')?.textContent === "2s"`, "the third attempt's row and diff arrive without a reload")
	click(t, ctx, chromedp.CSS(`button[data-copy="apply-gb-3"]`))
	poll(t, ctx, 5*time.Second, `["Copied", "Select and copy"].includes(document.querySelector('button[data-copy="apply-gb-3"]').textContent)`, "the copy button answers")
	require.NoError(t, chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`)))
	shot(t, ctx, "group-attempts")
	onPhone(t, ctx, "group-attempts")
	require.Empty(t, exceptions(), "no JavaScript error")
}
