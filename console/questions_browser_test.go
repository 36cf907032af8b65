package console

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination/relay"
)

// TestBrowserAnswerQuestion: in headless chromium, a run's question to the
// operator shows on its group's page as inert text with an answer box;
// typing an answer and pressing Answer returns to the page, and the run's
// ask returns the answer.
func TestBrowserAnswerQuestion(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, exceptions := browser(t)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	qid, answer := askOperator(t, b, b.nc, "br-asker", "crew-br", map[string]any{"to": "operator",
		"question": "<img src=x onerror=\"window.pwned=1\"> Which database?", "choices": []string{"postgres", "sqlite"}, "timeout_seconds": 60})

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.srv.URL+"/groups/default/crew-br")))
	poll(t, ctx, 10*time.Second, `document.querySelector("#question-`+qid+` .question-text")?.textContent.includes("<img src=x")`, "the question shows, as text")
	inert, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.pwned === undefined && document.querySelectorAll("main img").length === 0 &&
		document.querySelectorAll("#question-`+qid+` button.choice").length === 2`))
	require.NoError(t, err)
	require.True(t, inert, "inert text, a button per choice")
	shot(t, ctx, "question")
	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(`#question-`+qid+` textarea[name="text"]`), "postgres, version 17")))
	click(t, ctx, chromedp.CSS(`#question-`+qid+` button.answer`))
	poll(t, ctx, 10*time.Second, `location.search === "?answered=`+qid+`" && location.pathname === "/groups/default/crew-br"`, "back on the group's page")
	select {
	case got := <-answer:
		require.Equal(t, relay.AskAnswered, got.Status)
		require.Equal(t, "postgres, version 17", got.Answer)
	case <-time.After(20 * time.Second):
		t.Fatal("the ask did not return after the browser's answer")
	}
	require.Empty(t, exceptions(), "no JavaScript error")
}
