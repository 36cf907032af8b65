package console

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/internal/budgetkv"
	"github.com/jetcrew/jetcrew/messages"
)

// pausedRun is a run of pool default whose cost budget paused it, as its
// worker's proxy writes it; the worker of the test's setup never sees it.
func pausedRun(id string, now time.Time) messages.RunState {
	return messages.RunState{Version: 1, ID: id, State: messages.StateRunning, Profile: "claude", Pool: "default", Group: "team",
		Worker: "w-elsewhere", QueuedAt: now, StartedAt: now, UpdatedAt: now,
		Usage: &messages.UsageTotals{Requests: 7, Unknown: 1, CostUSD: 0.5123, Unpriced: 1, Refused: 2,
			Tokens: messages.Tokens{Input: 12345, Output: 2345, CacheRead: 100000, CacheWrite: 512}},
		Budget: "paused: budget reached: max_cost_usd 0.5 (spent 0.5123 USD) (jetcrew budget raises it)",
		Receipt: &messages.Receipt{Profile: "claude", Prices: "sha256:" + strings.Repeat("ab", 32),
			Budgets: &messages.ReceiptBudgets{MaxCostUSD: 0.5, MaxOutputTokens: 10000, OnBudget: "pause",
				Group: &messages.ReceiptSharedBudget{Name: "team", MaxCostUSD: 5, Window: "1h0m0s"}}}}
}

func TestUsageText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   int64
		c, t string
	}{
		{0, "0", "0"}, {999, "999", "999"}, {1000, "1k", "1,000"}, {1234, "1.2k", "1,234"}, {9999, "9.9k", "9,999"},
		{34567, "34k", "34,567"}, {1234567, "1.2M", "1,234,567"}, {123456789, "123M", "123,456,789"},
	} {
		require.Equal(t, tc.c, compact(tc.in), "compact(%d)", tc.in)
		require.Equal(t, tc.t, thousands(tc.in), "thousands(%d)", tc.in)
	}
	require.Equal(t, "$0.0123", dollars(0.01234))
	require.Equal(t, "$12.35", dollars(12.345))

	for _, tc := range []struct {
		name string
		u    *messages.UsageTotals
		want string
	}{
		{"unmetered", nil, ""},
		{"metered, nothing sent", &messages.UsageTotals{}, ""},
		{"priced", &messages.UsageTotals{Requests: 2, CostUSD: 0.0123, Tokens: messages.Tokens{Output: 1234}}, "$0.0123"},
		{"no price table", &messages.UsageTotals{Requests: 2, Unpriced: 2, Tokens: messages.Tokens{Output: 1234}}, "1.2k out tok"},
		{"usage unknown", &messages.UsageTotals{Requests: 3, Unknown: 3}, "3 req"},
	} {
		require.Equal(t, tc.want, usageShort(tc.u), tc.name)
	}

	require.Equal(t, "not priced", costText(&messages.UsageTotals{Requests: 2, Unpriced: 2}))
	require.Equal(t, "not priced", costText(&messages.UsageTotals{Requests: 1, Unknown: 1}))
	require.Equal(t, "$0.0000", costText(&messages.UsageTotals{Requests: 1}), "priced at zero")
	require.Equal(t, "$0.5000 (without the unpriced)", costText(&messages.UsageTotals{Requests: 3, Unpriced: 1, CostUSD: 0.5}))
	require.Equal(t, "$0.5000 (at least: a fee or tier the price table lacks)", costText(&messages.UsageTotals{Requests: 3, PartlyUnpriced: 1, CostUSD: 0.5}))
	require.Equal(t, "1,234 in · 56 out · 4,096 cache write (2,048 for 1h)", tokenKinds(messages.Tokens{Input: 1234, Output: 56, CacheWrite: 4096, CacheWrite1h: 2048}))
	v := newUsageView(&messages.RunState{Usage: &messages.UsageTotals{Requests: 2, WebSearches: 3, PartlyUnpriced: 1, CostUSD: 0.1}})
	require.Contains(t, v.Facts, fact{"Web searches", "3"})
	require.Contains(t, v.Facts, fact{"Partly unpriced", "1 response (a fee or tier the price table lacks)"})

	require.Equal(t, "run: $0.5000, 10,000 output tokens; group team: $5.00 per 1h0m0s; on budget: pause",
		budgetsText(pausedRun("r", time.Now()).Receipt.Budgets))
	require.Equal(t, "run: 3 requests; pool gpu: 1 request per 24h0m0s",
		budgetsText(&messages.ReceiptBudgets{MaxModelRequests: 3, Pool: &messages.ReceiptSharedBudget{Name: "gpu", MaxModelRequests: 1, Window: "24h0m0s"}}))

	require.Equal(t, "-", poolSpend(poolRow{}))
	require.Equal(t, "$0.0200 · 1.5k out tok", poolSpend(poolRow{Metered: 2, SpendUSD: 0.02, SpendOutput: 1500}))
	require.Equal(t, "80 out tok", poolSpend(poolRow{Metered: 1, SpendOutput: 80}))

	for in, want := range map[string]float64{"1": 1, "0.25": 0.25, " $2.5 ": 2.5, "+3": 3, "10000": 10000} {
		got, err := parseGrantUSD(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "0", "-1", "abc", "NaN", "Inf", "+Inf", "1e9", "10000.01", "1,5"} {
		_, err := parseGrantUSD(in)
		require.Error(t, err, in)
	}
}

// A run's page shows its model usage, exact to the token, its budget
// line, the budgets and price table of its receipt, and "Raise budget"
// while a budget pauses it; untrusted text in them is escaped.
func TestRunPageShowsUsage(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	now := time.Now().UTC()
	paused := pausedRun("paused-1", now)
	hostile := pausedRun("hostile-1", now)
	hostile.Budget = "paused: <script>alert(1)</script>\x1b[2J"
	hostile.Receipt.Budgets.Group.Name = "<b>team</b>"
	reached := pausedRun("reached-1", now)
	reached.State, reached.FinishedAt = messages.StateFailed, now
	reached.Reason = "budget reached: max_cost_usd 0.5 (spent 0.5123 USD)"
	reached.Budget = reached.Reason
	plain := messages.RunState{Version: 1, ID: "plain-1", State: messages.StateSucceeded, Profile: "shell", Pool: "default",
		QueuedAt: now, FinishedAt: now, UpdatedAt: now, Receipt: &messages.Receipt{Profile: "shell"}}
	b.putStates(t, paused, hostile, reached, plain)

	code, body := b.get(t, "/runs/paused-1")
	require.Equal(t, http.StatusOK, code)
	sec := between(body, `<section id="usage" >`, "</section>")
	require.NotEmpty(t, sec, "the usage section is shown: %s", body)
	require.Contains(t, sec, `<span class="budget" id="budget" >paused: budget reached: max_cost_usd 0.5 (spent 0.5123 USD) (jetcrew budget raises it)</span>`)
	require.Contains(t, sec, `<form method="post" action="/runs/paused-1/budget" id="raise-form" class="inline" >`)
	require.Contains(t, sec, `<input type="hidden" name="csrf" value="`+b.c.core.csrf+`">`)
	for _, f := range []string{
		`<dt>Model requests</dt><dd>7</dd>`,
		`<dt>Tokens</dt><dd>12,345 in · 2,345 out · 100,000 cache read · 512 cache write</dd>`,
		`<dt>Cost</dt><dd>$0.5123 (without the unpriced)</dd>`,
		`<dt>Unknown usage</dt><dd>1 request</dd>`,
		`<dt>Unpriced</dt><dd>1 response (no price for the model)</dd>`,
		`<dt>Refused</dt><dd>2 requests past a budget</dd>`,
		`<dt>Budgets</dt><dd>run: $0.5000, 10,000 output tokens; group team: $5.00 per 1h0m0s; on budget: pause</dd>`,
		`<dt>Price table</dt><dd>sha256:` + strings.Repeat("ab", 32) + `</dd>`,
	} {
		require.Contains(t, sec, f)
	}

	_, body = b.get(t, "/runs/hostile-1")
	require.NotContains(t, body, "<script>alert")
	require.NotContains(t, body, "<b>team")
	require.Contains(t, body, `paused: &lt;script&gt;alert(1)&lt;/script&gt;␛[2J`)
	require.Contains(t, body, `group &lt;b&gt;team&lt;/b&gt;: $5.00`)

	// A run its budget ended: the line, no button.
	_, body = b.get(t, "/runs/reached-1")
	require.Contains(t, body, `<span class="budget" id="budget" >budget reached: max_cost_usd 0.5 (spent 0.5123 USD)</span>`)
	require.Contains(t, body, `id="raise-form" class="inline" hidden>`)

	// An unmetered run: the section is hidden, empty.
	_, body = b.get(t, "/runs/plain-1")
	require.Contains(t, body, `<section id="usage" hidden>`)
	require.Contains(t, body, `<dl class="facts" id="usage-facts"></dl>`)
}

// The run page's live stream sends the usage with every state change, so
// the page follows a run's running totals and sees its pause end.
func TestRunPageUsageLive(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	now := time.Now().UTC()
	st := pausedRun("live-1", now)
	b.putStates(t, st)
	rev := b.c.cache.current()

	st.Usage.Requests, st.Usage.Tokens.Output, st.Budget = 8, 2400, ""
	st.UpdatedAt = now.Add(time.Second)
	stream := b.readSSEOpened(t, "/live/run/live-1?rev="+strconv.FormatUint(rev, 10), 10*time.Second, func() {
		b.putStates(t, st)
	}, func(s string) bool { return strings.Contains(s, "2,400 out") })
	require.Contains(t, stream, `{"label":"Model requests","text":"8"}`)
	require.Contains(t, stream, `"usage":"$0.5123"`)
	require.NotContains(t, stream, `"paused":true`, "no longer paused once the budget line is gone")

	// The runs list's stream carries the short form.
	hostile := pausedRun("live-2", now)
	hostile.Budget = "paused: <img src=x>"
	stream = b.readSSEOpened(t, "/live/runs?q=live-&rev="+strconv.FormatUint(b.c.cache.current(), 10), 10*time.Second, func() {
		b.putStates(t, hostile)
	}, func(s string) bool { return strings.Contains(s, `"id":"live-2"`) })
	require.Contains(t, stream, `"budget":"paused: \u003cimg src=x\u003e","paused":true`)
}

// The runs list has a short usage column: the cost when priced, else the
// output tokens; blank for a run that is not metered.
func TestRunsListUsageColumn(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	now := time.Now().UTC()
	priced := pausedRun("col-priced", now)
	priced.Usage.CostUSD = 0.0123
	tokens := pausedRun("col-tokens", now.Add(time.Millisecond))
	tokens.Usage = &messages.UsageTotals{Requests: 3, Unpriced: 3, Tokens: messages.Tokens{Output: 1234}}
	plain := messages.RunState{Version: 1, ID: "col-plain", State: messages.StateSucceeded, Profile: "shell", Pool: "default",
		QueuedAt: now.Add(2 * time.Millisecond), UpdatedAt: now}
	b.putStates(t, priced, tokens, plain)

	_, body := b.get(t, "/runs?q=col-")
	require.Contains(t, body, `<th class="num">Usage</th>`)
	usage := func(id string) string {
		return between(between(body, `<tr data-id="`+id+`"`, "</tr>"), `<td class="num">`, "</td>")
	}
	require.Equal(t, "$0.0123", usage("col-priced"))
	require.Equal(t, "1.2k out tok", usage("col-tokens"))
	require.Equal(t, "", usage("col-plain"))
}

// The overview sums, per pool, the model usage of the runs whose state
// changed in the last hour.
func TestOverviewSpendLastHour(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	now := time.Now().UTC()
	run := func(id, pool string, updated time.Time, usd float64, out int64) messages.RunState {
		return messages.RunState{Version: 1, ID: id, State: messages.StateSucceeded, Profile: "claude", Pool: pool,
			QueuedAt: updated, FinishedAt: updated, UpdatedAt: updated,
			Usage: &messages.UsageTotals{Requests: 1, CostUSD: usd, Tokens: messages.Tokens{Output: out}}}
	}
	b.putStates(t,
		run("s1", "gpu", now.Add(-time.Minute), 0.01, 1000),
		run("s2", "gpu", now.Add(-59*time.Minute), 0.0123, 500),
		run("s3", "gpu", now.Add(-61*time.Minute), 7, 99999), // before the hour
		run("s4", "cheap", now, 0, 80),
		messages.RunState{Version: 1, ID: "s5", State: messages.StateSucceeded, Profile: "shell", Pool: "plain", QueuedAt: now, UpdatedAt: now},
	)
	_, body := b.get(t, "/overview/fragment")
	require.Contains(t, body, "Spend, last hour")
	spend := func(pool string) string {
		row := between(body, `<a href="/runs?pool=`+pool+`">`+pool+`</a>`, "</tr>")
		cells := strings.Split(row, `<td class="num">`)
		return strings.TrimSuffix(cells[len(cells)-1], "</td>")
	}
	require.Equal(t, "$0.0223 · 1.5k out tok", spend("gpu"))
	require.Equal(t, "80 out tok", spend("cheap"))
	require.Equal(t, "-", spend("plain"))
}

// budgetsBucket returns the jetcrew-budgets bucket, creating it when no
// worker provisioned it yet.
func budgetsBucket(t *testing.T, js jetstream.JetStream) jetstream.KeyValue {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), messages.BucketBudgets)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: messages.BucketBudgets, History: 1, TTL: messages.BudgetKeyMaxAge})
	}
	require.NoError(t, err)
	return kv
}

// "Raise budget" posts an amount in dollars; the console grants it on the
// run's own budget (grant.run.<id> in jetcrew-budgets), grants add up, and
// the POST has the protections of every action.
func TestRaiseBudgetGrants(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	kv := budgetsBucket(t, b.js)
	b.putStates(t, pausedRun("grant-1", time.Now().UTC()))
	key := messages.GrantKey(messages.BudgetScopeRun, "grant-1")
	granted := func() messages.BudgetSpend {
		v, _, err := budgetkv.Get(t.Context(), kv, key)
		require.NoError(t, err)
		return v
	}
	path := "/runs/grant-1/budget"

	resp, _ := b.post(t, path, url.Values{"usd": {"1"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "no CSRF token")
	resp, _ = b.post(t, path, url.Values{"csrf": {b.c.core.csrf}, "usd": {"1"}}, "Sec-Fetch-Site", "cross-site")
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "cross-site")
	resp, _ = b.post(t, path, url.Values{"csrf": {b.c.core.csrf}, "usd": {"1"}}, "Origin", "http://evil.example")
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "foreign origin")
	code, _ := b.get(t, path+"?usd=1")
	require.Equal(t, http.StatusMethodNotAllowed, code, "a GET never grants")
	for _, bad := range []string{"", "0", "-1", "NaN", "1e9", "<b>x</b>"} {
		resp, body := b.post(t, path, url.Values{"csrf": {b.c.core.csrf}, "usd": {bad}})
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, bad)
		require.NotContains(t, body, "<b>x", "the amount is echoed escaped")
	}
	resp, _ = b.post(t, "/runs/bad.id/budget", url.Values{"csrf": {b.c.core.csrf}, "usd": {"1"}})
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "a run id that is not a token")
	require.Equal(t, messages.BudgetSpend{}, granted(), "nothing granted yet")

	resp, _ = b.post(t, path, url.Values{"csrf": {b.c.core.csrf}, "usd": {"0.25"}}, "Sec-Fetch-Site", "same-origin")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "/runs/grant-1", resp.Header.Get("Location"))
	require.Equal(t, messages.BudgetSpend{CostUSD: 0.25}, granted())
	resp, _ = b.post(t, path, url.Values{"csrf": {b.c.core.csrf}, "usd": {"$1.5"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, messages.BudgetSpend{CostUSD: 1.75}, granted(), "grants add up")

	// Without the bucket the console says what to do.
	require.NoError(t, b.js.DeleteKeyValue(t.Context(), messages.BucketBudgets))
	resp, body := b.post(t, path, url.Values{"csrf": {b.c.core.csrf}, "usd": {"1"}})
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	require.Contains(t, body, "no budgets bucket")
}

// A read-only console (the observer's) shows no action, not even on a
// paused run, and refuses every action's POST.
func TestReadOnlyShowsNoActions(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{readOnly: true})
	kv := budgetsBucket(t, b.js)
	b.putStates(t, pausedRun("ro-1", time.Now().UTC()))
	failed := b.submit(t, messages.RunRequest{Prompt: "exit 3"})
	b.waitState(t, failed, messages.StateFailed)
	require.Eventually(t, func() bool { _, err := b.d.LastDeadLetter(t.Context(), failed); return err == nil }, 15*time.Second, 10*time.Millisecond)

	_, body := b.get(t, "/runs/ro-1")
	require.Contains(t, body, `<span class="budget" id="budget" >paused: `, "the budget line is shown")
	require.Contains(t, body, `<dt>Model requests</dt><dd>7</dd>`)
	for _, form := range []string{`id="raise-form"`, `id="cancel-form"`, `id="replay-form"`, `name="csrf"`} {
		require.NotContains(t, body, form)
	}
	_, body = b.get(t, "/runs/"+failed)
	require.NotContains(t, body, `id="replay-form"`)
	_, body = b.get(t, "/dead-letters")
	require.Contains(t, body, failed)
	require.NotContains(t, body, `action="/dead-letters/replay"`)

	for _, path := range []string{"/runs/ro-1/budget", "/runs/ro-1/cancel", "/runs/" + failed + "/replay", "/dead-letters/replay", "/dead-letters/archive", "/dead-letters/discard"} {
		resp, _ := b.post(t, path, url.Values{"csrf": {b.c.core.csrf}, "usd": {"1"}, "run": {failed}, "confirm": {"yes"}})
		require.Equal(t, http.StatusForbidden, resp.StatusCode, path)
	}
	v, _, err := budgetkv.Get(context.WithoutCancel(t.Context()), kv, messages.GrantKey(messages.BudgetScopeRun, "ro-1"))
	require.NoError(t, err)
	require.Equal(t, messages.BudgetSpend{}, v, "nothing granted")
	st, err := b.d.Status(t.Context(), failed)
	require.NoError(t, err)
	require.Zero(t, st.Replays, "nothing replayed")

	// The same run on an operator's console offers the button.
	op := setup(t, setupOpts{})
	op.putStates(t, pausedRun("ro-1", time.Now().UTC()))
	_, body = op.get(t, "/runs/ro-1")
	require.Contains(t, body, `<button type="submit" id="raise">Raise budget</button>`)
}
