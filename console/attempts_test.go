package console

import (
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// attemptsFixture stores three attempts of group g (submit --attempts):
// g-1 succeeded with a hostile patch, a bundle and metered usage; g-2
// failed (exit code 1) with a patch larger than the group page shows;
// g-3 still runs. It returns them in that order.
func attemptsFixture(t *testing.T, b *bundle, g string) []messages.RunState {
	t.Helper()
	q := time.Now().UTC().Add(-3 * time.Minute).Truncate(time.Millisecond)
	big := "diff --git a/big b/big\n" + strings.Repeat("+"+strings.Repeat("y", 99)+"\n", 1000)
	one, two := 1, 1
	runs := []messages.RunState{
		{ID: g + "-1", Group: g, State: messages.StateSucceeded, Pool: "default", Profile: "shell", Attempts: 1, ExitCode: new(0),
			QueuedAt: q, StartedAt: q.Add(time.Second), FinishedAt: q.Add(84 * time.Second), UpdatedAt: q.Add(84 * time.Second),
			Usage:           &messages.UsageTotals{Requests: 3, Tokens: messages.Tokens{Input: 100, Output: 20, CacheRead: 5}, CostUSD: 0.0125},
			WorkspaceResult: resultFixture(t, b.js, g+"-1", map[string][]byte{messages.ResultPatch: []byte(hostilePatch), messages.ResultBundle: []byte("b")})},
		{ID: g + "-2", Group: g, State: messages.StateFailed, Reason: "", Pool: "default", Profile: "shell", Attempts: 1, ExitCode: &one,
			QueuedAt: q, StartedAt: q.Add(time.Second), FinishedAt: q.Add(1500 * time.Millisecond), UpdatedAt: q.Add(2 * time.Second),
			WorkspaceResult: resultFixture(t, b.js, g+"-2", map[string][]byte{messages.ResultPatch: []byte(big), messages.ResultBundle: []byte("b")})},
		{ID: g + "-3", Group: g, State: messages.StateRunning, Pool: "default", Profile: "sh\u202eell", Attempts: two,
			QueuedAt: q, StartedAt: q.Add(time.Second), UpdatedAt: q.Add(time.Second)},
	}
	runs[1].WorkspaceResult.Insertions, runs[1].WorkspaceResult.Deletions, runs[1].WorkspaceResult.FilesChanged = 1000, 0, 1
	b.putStates(t, runs[2], runs[0], runs[1])
	return runs
}

// Issue 28: the group page compares a group's attempts as `jetcrew
// compare` does (submit order, outcome, duration, diffstat, tokens, cost)
// and shows each one's diff side by side, inert, cut for a large one with
// links to the rest, and `jetcrew apply ID` to copy; the section alone is
// served for the page's script.
func TestGroupAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	attemptsFixture(t, b, "ga")

	code, body := b.get(t, "/groups/default/ga")
	require.Equal(t, http.StatusOK, code)
	table := between(body, `<tbody id="runs">`, "</tbody>")
	rows := regexp.MustCompile(`<tr data-id="([^"]+)"`).FindAllStringSubmatch(table, -1)
	require.Len(t, rows, 3)
	for i, want := range []string{"ga-1", "ga-2", "ga-3"} {
		require.Equal(t, want, rows[i][1], "in the order they were submitted")
	}
	cells := func(id string) []string {
		row := between(table, `<tr data-id="`+id+`"`, "</tr>")
		var out []string
		for _, m := range regexp.MustCompile(`<td[^>]*>(.*?)</td>`).FindAllStringSubmatch(row, -1) {
			out = append(out, html.UnescapeString(regexp.MustCompile(`<[^>]+>`).ReplaceAllString(m[1], "")))
		}
		return out
	}
	one := cells("ga-1")
	require.Equal(t, []string{"succeeded", "1m23s", "2", "+3", "-1", "125", "$0.0125"}, []string{one[4], one[5], one[6], one[7], one[8], one[9], one[10]})
	two := cells("ga-2")
	require.Equal(t, []string{"failed (exit code 1)", "500ms", "1", "+1000", "-0", "-", "-"}, []string{two[4], two[5], two[6], two[7], two[8], two[9], two[10]})
	three := cells("ga-3")
	require.Equal(t, []string{"sh<U+202E>ell", "running", "-", "-", "-"}, []string{three[2], three[4], three[5], three[6], three[9]})

	diffs := between(body, `<section id="diffs">`, "</section>")
	require.Equal(t, 2, strings.Count(diffs, `<article class="attempt"`), "a card per attempt with a result; none for the running one")
	require.NotContains(t, diffs, `data-run="ga-3"`)
	card1 := between(diffs, `data-run="ga-1"`, "</article>")
	require.Contains(t, card1, `<code id="apply-ga-1">jetcrew apply ga-1</code> <button type="button" class="copy" data-copy="apply-ga-1">Copy</button>`)
	require.Contains(t, card1, `<span class="add">&#43;// &lt;script&gt;window.pwned=1&lt;/script&gt;`+"\n</span>")
	require.Contains(t, card1, `<span class="add">&#43;// ␛[31mred&lt;U&#43;202E&gt;`+"\n</span>")
	require.Contains(t, card1, "src/&lt;i&gt;x&lt;/i&gt;.go")
	require.NotContains(t, card1, "patch-cut")
	require.NotContains(t, body, "<script>window")
	card2 := between(diffs, `data-run="ga-2"`, "</article>")
	require.Contains(t, card2, `class="note patch-cut"`)
	require.Contains(t, card2, `<a href="/runs/ga-2#changes">more on its page</a>, or <a href="/runs/ga-2/result/patch">download the whole patch</a>`)
	shown := html.UnescapeString(regexp.MustCompile(`</?span[^>]*>`).ReplaceAllString(between(card2, `<pre class="diff">`, "</pre>"), ""))
	require.LessOrEqual(t, len(shown), maxAttemptPatch, "an attempt's card holds at most its patch's first bytes")
	require.True(t, strings.HasSuffix(shown, "\n") && len(shown) > maxAttemptPatch-200, "cut at a whole line near the cap")

	// The section alone, for the page's script.
	code, frag := b.get(t, "/groups/default/ga/attempts")
	require.Equal(t, http.StatusOK, code)
	require.True(t, strings.HasPrefix(frag, `<div id="attempts">`), frag[:min(80, len(frag))])
	require.Contains(t, frag, `data-key="succeeded|`)
	code, _ = b.get(t, "/groups/default/a.b/attempts")
	require.Equal(t, http.StatusBadRequest, code)

	// A group without a workspace run has no diffs section.
	b.putStates(t, messages.RunState{ID: "talk-1", Group: "talk", State: messages.StateSucceeded, Pool: "default", Profile: "shell", UpdatedAt: time.Now()})
	_, body = b.get(t, "/groups/default/talk")
	require.Contains(t, body, `<tr data-id="talk-1"`)
	require.NotContains(t, body, `id="diffs"`)
}
