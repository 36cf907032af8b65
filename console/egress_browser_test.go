package console

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// TestBrowserEgress drives the egress page in headless chromium: the
// overview's alert leads to it, a question put while it is open appears
// without a reload, "for the whole profile" with Allow leaves the answer
// and the profile's approval in the buckets, a question given up leaves
// the list, and a hostile host name stays text.
func TestBrowserEgress(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	asks, approvals := egressBuckets(t, b.js)
	ctx, exceptions := browser(t)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	putAsk(t, asks, "br-ask-1", "net", "pypi.org", 443, 1)

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.srv.URL+"/")))
	poll(t, ctx, 15*time.Second, `document.querySelector("#egress-alert a")?.textContent === "1 connection waits for an operator"`, "the overview alerts")
	click(t, ctx, chromedp.CSS(`#egress-alert a`))
	poll(t, ctx, 15*time.Second, `location.pathname === "/egress" && document.getElementById("live")?.classList.contains("on")`, "the egress page's live stream opens")
	poll(t, ctx, 5*time.Second, `document.querySelector('tr[data-id="br-ask-1.1"] .host')?.textContent === "pypi.org:443"`, "the question is listed")

	// A question put while the page is open appears; the box ticked on
	// the first row stays ticked through the swap.
	click(t, ctx, chromedp.CSS(`tr[data-id="br-ask-1.1"] .for-profile`))
	putAsk(t, asks, "br-ask-2", "net", "<img src=x onerror=window.pwned=1>", 8443, 1)
	poll(t, ctx, 10*time.Second, `document.querySelector('tr[data-id="br-ask-2.1"]') !== null`, "the new question appears live")
	inert, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.pwned === undefined && document.querySelectorAll("main img").length === 0 &&
		document.querySelector('tr[data-id="br-ask-2.1"] .host').textContent === "<img src=x onerror=window.pwned=1>:8443" &&
		document.querySelector('tr[data-id="br-ask-1.1"] .for-profile').checked`))
	require.NoError(t, err)
	require.True(t, inert, "the host name is text, and the ticked box stayed ticked")
	shot(t, ctx, "egress")
	onPhone(t, ctx, "egress")

	// The ages move by themselves.
	before, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('tr[data-id="br-ask-1.1"] td[data-until]').textContent`))
	require.NoError(t, err)
	poll(t, ctx, 5*time.Second, `document.querySelector('tr[data-id="br-ask-1.1"] td[data-until]').textContent !== "`+before+`"`, "refused in counts down")

	click(t, ctx, chromedp.CSS(`tr[data-id="br-ask-1.1"] button.allow`))
	poll(t, ctx, 10*time.Second, `document.getElementById("answered")?.textContent === "Answered br-ask-1.1."`, "the answer is reported")
	a, ok := answerOf(t, asks, messages.EgressAnswerKey("br-ask-1.1"))
	require.True(t, ok)
	require.True(t, a.Allow)
	require.Equal(t, "profile", a.Scope)
	_, ok = answerOf(t, approvals, messages.EgressApprovalKey("net", "pypi.org", 443))
	require.True(t, ok, "kept for the profile")
	poll(t, ctx, 5*time.Second, `document.querySelector('tr[data-id="br-ask-1.1"]') === null`, "the answered question is not listed")

	// Its worker gives the other up (the timeout refused it): it goes.
	poll(t, ctx, 10*time.Second, `document.getElementById("live")?.classList.contains("on")`, "the live stream opens again")
	require.NoError(t, asks.Delete(t.Context(), messages.EgressAskKey("br-ask-2.1")))
	poll(t, ctx, 10*time.Second, `document.querySelector("#asks tbody td.muted")?.textContent === "No connection waits for an operator."`, "the given-up question leaves live")
	require.Empty(t, exceptions(), "no JavaScript error")
}
