package console

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// TestBrowserListsSearchAndDeadLetters drives the lists in chromium (issue
// 27): a search typed into the runs list's form finds runs by label and
// reason whatever the case, a label chip clicked filters by its label, and
// the dead letters page hides a healed run's dead letter until "Show
// resolved" is clicked; both pages fit a phone.
func TestBrowserListsSearchAndDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, exceptions := browser(t)
	u := b.srv.URL

	healed := b.submit(t, messages.RunRequest{Prompt: "out x;exit 3", Labels: map[string]string{"team": "Blue"}})
	failing := b.submit(t, messages.RunRequest{Prompt: "exit 4", Labels: map[string]string{"team": "red"}})
	ok := b.submit(t, messages.RunRequest{Prompt: "out fine", Labels: map[string]string{"team": "red"}})
	for id, want := range map[string]messages.State{healed: messages.StateFailed, failing: messages.StateFailed, ok: messages.StateSucceeded} {
		b.waitState(t, id, want)
	}
	for _, id := range []string{healed, failing} {
		require.Eventually(t, func() bool { _, err := b.d.LastDeadLetter(t.Context(), id); return err == nil }, 15*time.Second, 10*time.Millisecond)
	}
	st := b.waitState(t, healed, messages.StateFailed)
	st.State, st.Replays, st.Reason, st.UpdatedAt = messages.StateSucceeded, 1, "", time.Now().UTC()
	b.putStates(t, st)

	rows := `[...document.querySelectorAll("#runs tr[data-id]")].map(r => r.dataset.id).join(",")`
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(u+"/runs")))
	poll(t, ctx, 10*time.Second, fmt.Sprintf(`%s.split(",").length === 3`, rows), "the runs list shows the three runs")
	// A search by reason, in another case.
	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys(`input[name="q"]`, "EXIT CODE 4\n")))
	poll(t, ctx, 10*time.Second, fmt.Sprintf(`%s === %q`, rows, failing), "the search by reason finds the failing run")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(u+"/runs?state=failure")))
	poll(t, ctx, 10*time.Second, fmt.Sprintf(`%s === %q`, rows, failing), "any failure lists the failing run only")
	shot(t, ctx, "runs-failures")
	onPhone(t, ctx, "runs-failures")
	// A label chip filters by its label.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(u+"/runs")))
	poll(t, ctx, 10*time.Second, fmt.Sprintf(`%s.split(",").length === 3`, rows), "the runs list shows the three runs")
	click(t, ctx, chromedp.CSS(`tr[data-id="`+ok+`"] a.label`))
	poll(t, ctx, 10*time.Second, fmt.Sprintf(`%s === %q`, rows, ok+","+failing), "the chip team=red filters")
	poll(t, ctx, 5*time.Second, `location.search.includes("label=team%3Dred")`, "the chip's filter is in the address")

	// Dead letters: the healed one hidden until asked for.
	dead := `[...document.querySelectorAll("tr[data-run]")].map(r => r.dataset.run + ":" + r.querySelector(".fate").textContent).join(",")`
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(u+"/dead-letters")))
	poll(t, ctx, 10*time.Second, fmt.Sprintf(`%s === %q`, dead, failing+":still failing"), "only the failing dead letter shows")
	onPhone(t, ctx, "dead-letters-lifecycle")
	click(t, ctx, chromedp.ID("show-resolved"))
	poll(t, ctx, 10*time.Second, fmt.Sprintf(`%s.includes(%q)`, dead, healed+":replayed and healed"), "Show resolved shows the healed one")
	shot(t, ctx, "dead-letters-resolved")
	onPhone(t, ctx, "dead-letters-resolved")
	click(t, ctx, chromedp.ID("hide-resolved"))
	poll(t, ctx, 10*time.Second, fmt.Sprintf(`%s === %q`, dead, failing+":still failing"), "Hide resolved hides it again")
	require.Empty(t, exceptions(), "no JavaScript error on any page")
}
