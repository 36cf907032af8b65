package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// The budget tests run real runs of a metered profile (egress_inject, with
// budgets) on real Docker against the stand-in provider's Messages API
// (tests/fixtures/egress), whose every answer reports the usage
// fixtureTokens.

// budgetPrices is the worker's price table: the model is priced by its
// undated name, which prices the dated one the runs ask for.
const budgetPrices = `[models."claude-sonnet-4-5"]
input = 3.0
output = 15.0
cache_read = 0.30
cache_write = 3.75

[models."gpt-5"]
input = 1.25
output = 10.0
cache_read = 0.125

[models."gpt-4o"]
input = 2.5
output = 10.0
`

// budgetModel is the model the runs ask for.
const budgetModel = "claude-sonnet-4-5-20250929"

// fixtureTokens are the tokens of every Messages answer of the stand-in,
// streamed or not (its stream's message_delta repeats them cumulatively).
var fixtureTokens = messages.Tokens{Input: 11, Output: 5, CacheRead: 2, CacheWrite: 1}

// fixtureCostUSD is what fixtureTokens cost by budgetPrices.
const fixtureCostUSD = (11*3.0 + 5*15.0 + 2*0.30 + 1*3.75) / 1e6

// budgetProfile is the metered profiles: bud with inj.provider.test with
// the key injected, api.provider.test allowed but not injected (another
// name of the same address), no address rule (the provider's network
// looks public), at most 2 model requests and 1 USD; bud2 with 1 USD and
// POST /v1/embeddings passing unmetered; bud99 with 1 USD alone.
func budgetProfile(image string) string {
	return fmt.Sprintf(`[profiles.bud]
image = %[1]q
command = ["/bin/sh", "-c", "{prompt}"]
coordination = false
egress = ["inj.provider.test:443", "api.provider.test:443"]
egress_inject = [{ host = "inj.provider.test:443", header = "x-api-key", from_env = "JETCREW_TEST_PROVIDER_KEY" }]
max_model_requests = 2
max_cost_usd = 1.0

[profiles.bud2]
image = %[1]q
command = ["/bin/sh", "-c", "{prompt}"]
coordination = false
egress = ["inj.provider.test:443"]
egress_inject = [{ host = "inj.provider.test:443", header = "x-api-key", from_env = "JETCREW_TEST_PROVIDER_KEY" }]
max_cost_usd = 1.0
egress_unmetered_paths = ["POST /v1/embeddings"]

[profiles.bud99]
image = %[1]q
command = ["/bin/sh", "-c", "{prompt}"]
coordination = false
egress = ["inj.provider.test:443"]
egress_inject = [{ host = "inj.provider.test:443", header = "x-api-key", from_env = "JETCREW_TEST_PROVIDER_KEY" }]
max_cost_usd = 1.0
`, image)
}

// pauseStall is the stall_timeout of pauseProfile: far shorter than its
// budget_pause.
const pauseStall = 2 * time.Second

// pauseProfile is a metered profile that pauses at its budget (one model
// request) for up to two minutes, with a stall timeout of pauseStall.
func pauseProfile(image string) string {
	return fmt.Sprintf(`[profiles.budpause]
image = %q
command = ["/bin/sh", "-c", "{prompt}"]
coordination = false
egress = ["inj.provider.test:443"]
egress_inject = [{ host = "inj.provider.test:443", header = "x-api-key", from_env = "JETCREW_TEST_PROVIDER_KEY" }]
max_model_requests = 1
on_budget = "pause"
budget_pause = "2m"
stall_timeout = %q
`, image, pauseStall.String())
}

// pauseScript sends two model requests, the second past the budget (held
// until a grant), printing "P<n> status=...", then DONE.
func pauseScript() string {
	return fmt.Sprintf(`m='%s'
echo "P1 $(egress-fixture post https://inj.provider.test/v1/messages "$m")"
echo "P2 $(egress-fixture post https://inj.provider.test/v1/messages "$m")"
echo DONE
`, messagesBody(false))
}

// costProfile is a metered profile with a cost budget alone (no request
// limit): inj.provider.test with the key injected, at most 0.01 USD.
func costProfile(image string) string {
	return fmt.Sprintf(`[profiles.budc]
image = %q
command = ["/bin/sh", "-c", "{prompt}"]
coordination = false
egress = ["inj.provider.test:443"]
egress_inject = [{ host = "inj.provider.test:443", header = "x-api-key", from_env = "JETCREW_TEST_PROVIDER_KEY" }]
max_cost_usd = 0.01
`, image)
}

// incompleteTokens are the tokens of every Responses answer of the
// stand-in to a request with max_output_tokens 16: it stops at the limit
// (status incomplete) and reports its usage.
var incompleteTokens = messages.Tokens{Input: 1000, Output: 16}

// incompleteCostUSD is what incompleteTokens cost by budgetPrices (gpt-5):
// 0.00141 USD.
const incompleteCostUSD = (1000*1.25 + 16*10.0) / 1e6

// incompleteServed is how many of incompleteLoopScript's requests a 0.01
// USD budget serves: after 7 answers (0.00987 USD spent) the 8th request's
// worst case (its 16 output tokens and its body's 26 input tokens, about
// 0.0002 USD) does not fit, so it is refused before it is sent.
const incompleteServed = 7

// incompleteLoopScript sends Responses requests with max_output_tokens 16
// in a loop, streamed and not in turn, each line "R<n> status=...", until
// one is refused (429); then waits: the worker must stop it for its cost
// budget.
func incompleteLoopScript() string {
	return `i=0
while [ $i -lt 40 ]; do
  i=$((i+1))
  s=false; [ $((i % 2)) -eq 0 ] && s=true
  out=$(egress-fixture post https://inj.provider.test/v1/responses "{\"model\":\"gpt-5\",\"input\":\"write a novel\",\"max_output_tokens\":16,\"stream\":$s}")
  echo "R$i $out"
  case "$out" in status=429*) echo REFUSED; break;; esac
done
sleep 60
`
}

// completeScript tries what a run with a cost budget might use to spend
// unmetered, one line each: a chat stream whose client did not ask for
// usage (CHAT, the whole body), a path the proxy does not meter
// (UNMETERED), the path the profile lists (LISTED), a model the price
// table lacks (UNPRICED), a WebSocket upgrade (WS).
func completeScript() string {
	return `c='{"model":"gpt-4o","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}'
u='{"model":"mystery-model-1","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}'
echo "CHAT $(egress-fixture post -full https://inj.provider.test/v1/chat/completions "$c")"
echo "UNMETERED $(egress-fixture post https://inj.provider.test/v1/completions '{"model":"gpt-4o","prompt":"hi"}')"
echo "LISTED $(egress-fixture post https://inj.provider.test/v1/embeddings '{"model":"e","input":"hi"}')"
echo "UNPRICED $(egress-fixture post https://inj.provider.test/v1/messages "$u")"
echo "WS $(egress-fixture post -X GET -H Upgrade:websocket -H Connection:Upgrade https://inj.provider.test/v1/realtime '')"
echo DONE
`
}

// overScript spends 99 % of the 1 USD budget in one request (66 000
// output tokens at 15 USD a million, every one used), then sends 64
// requests at once that each use all of their 100 output tokens, then
// waits: the worker must stop it for the budget.
func overScript() string {
	return fmt.Sprintf(`big='{"model":%[1]q,"max_tokens":66000,"messages":[{"role":"user","content":"hi"}]}'
small='{"model":%[1]q,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}'
echo "FIRST $(egress-fixture post -H X-Fixture-Output:max https://inj.provider.test/v1/messages "$big")"
echo "MANY $(egress-fixture posts 64 -H X-Fixture-Output:max https://inj.provider.test/v1/messages "$small")"
echo DONE
sleep 60
`, budgetModel)
}

// messagesBody is a Messages API request body for budgetModel.
func messagesBody(stream bool) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":16,"stream":%t,"messages":[{"role":"user","content":"hi"}]}`, budgetModel, stream)
}

// budgetScript sends three model requests to the metered host (plain,
// streamed, plain), each line "R<n> status=... key=... body=...", then
// waits: the worker must stop it for the budget the third one hit.
func budgetScript() string {
	return fmt.Sprintf(`m='%[1]s'; s='%[2]s'
echo "R1 $(egress-fixture post https://inj.provider.test/v1/messages "$m")"
echo "R2 $(egress-fixture post https://inj.provider.test/v1/messages "$s")"
echo "R3 $(egress-fixture post https://inj.provider.test/v1/messages "$m")"
echo DONE
sleep 60
`, messagesBody(false), messagesBody(true))
}

// bypassScript tries to reach the provider past the metering, with the
// agent's own key (post's): directly (network none), through the proxy by
// the provider's address, by a name the profile does not list, and by
// another listed name of the same address; then once through the metered
// name. Each line is "<check> <what happened>".
func bypassScript(provider netip.Addr) string {
	return fmt.Sprintf(`m='%[2]s'
if nc -w 2 %[1]s 443 </dev/null >/dev/null 2>&1; then echo "direct ok"; else echo "direct fail"; fi
echo "address $(egress-fixture post -k https://%[1]s/v1/messages "$m")"
echo "unlisted $(egress-fixture post -k https://other.provider.test/v1/messages "$m")"
echo "alias $(egress-fixture post -k https://api.provider.test/v1/messages "$m")"
echo "metered $(egress-fixture post https://inj.provider.test/v1/messages "$m")"
`, provider, messagesBody(false))
}

// scriptLines returns the run's output lines by their first word.
func scriptLines(out string) map[string]string {
	res := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			res[k] = v
		}
	}
	return res
}

// keyTag is how the stand-in names a key it saw (X-Fixture-Key, for one
// key).
func keyTag(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "key=" + hex.EncodeToString(sum[:8]) + "/n=1 "
}

// TestEgressBudget runs the metered profiles on real Docker, six runs at
// once on one worker.
//
// budget: a run sends a plain and a streamed model request (200 each, the
// worker's key in place of the agent's), then a third that the proxy
// answers itself with Anthropic's 429 rate_limit_error naming
// max_model_requests; the worker then stops the run (its script would
// sleep a minute), failed with "budget reached: max_model_requests 2". Its
// usage is exact to the token (the stream's cumulative message_delta is
// not added twice) and priced by the table, in the state, on the finished
// event and in exactly two usage events and one budget event; the receipt
// names the price table and the budgets; the key is nowhere in the state
// or the events.
//
// bypass: a run of the same profile, with a key of its own, cannot reach
// the provider past the metering: not directly (network none), not
// through the proxy by the provider's address or by a name the profile
// does not list, and not by another name the profile lists
// (api.provider.test, not injected) that resolves to the metered host's
// address (403, an egress event naming the metered host). Only its
// request to the metered name is answered, with the worker's key, and
// counted.
//
// complete (a run of bud2, with max_cost_usd): nothing it sends is free by
// accident. A chat stream its client sent without include_usage is metered
// (the provider was asked for usage) and the client's stream has no usage
// chunk; a path the proxy does not meter is refused (403, naming it and
// egress_unmetered_paths), the listed one passes and the receipt names
// it; a model the price table lacks is refused naming it; a WebSocket
// upgrade is refused. None of these refusals ends the run.
//
// overshoot (a run of bud99): at 99 % of max_cost_usd, 64 requests at once
// end with the run's cost within its budget (each reserved its worst case
// before it was sent); the run ends failed for the budget.
//
// a pause longer than the stall timeout (a run of budpause): a request
// held at the budget (on_budget = "pause") keeps the run from being
// stopped as stalled, and a grant lets it go on (requirePauseOutlivesStall).
//
// a Responses incomplete loop (a run of budc, max_cost_usd alone):
// answers that end response.incomplete are counted at their usage, and
// the loop is stopped within its budget (incompleteLoop).
func TestEgressBudget(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	prices, err := usage.ParsePrices("budget-test", []byte(budgetPrices))
	require.NoError(t, err)
	profiles := func(image string) string { return budgetProfile(image) + pauseProfile(image) + costProfile(image) }
	e := startEgressWorkerOpts(t, egressOptions{profiles: profiles, prices: prices, publicNet: true})
	budget, bypass, paused, incomplete := "eg-budget-"+opsSuffix(t), "eg-bypass-"+opsSuffix(t), "eg-paused-"+opsSuffix(t), "eg-incomplete-"+opsSuffix(t)
	complete, over := "eg-complete-"+opsSuffix(t), "eg-over-"+opsSuffix(t)
	e.submit(t, budget, "bud", budgetScript())
	e.submit(t, bypass, "bud", bypassScript(e.provider))
	e.submit(t, paused, "budpause", pauseScript())
	e.submit(t, incomplete, "budc", incompleteLoopScript())
	e.submit(t, complete, "bud2", completeScript())
	e.submit(t, over, "bud99", overScript())
	t.Run("complete", func(t *testing.T) { checkComplete(t, e, complete) })
	t.Run("overshoot", func(t *testing.T) { checkOvershoot(t, e, over) })

	t.Run("budget", func(t *testing.T) {
		st := waitState(t, e.url, budget, func(s messages.RunState) bool { return s.State.Final() })
		all := eventsToFinished(t, e.js, budget)
		out, _ := egressRunOutput(t, e.js, budget)
		reached := "budget reached: max_model_requests 2 (2 model requests sent)"
		require.Equal(t, messages.StateFailed, st.State, "%s\n%s", st.Reason, out)
		require.Contains(t, st.Reason, "budget reached: max_model_requests 2", out)
		require.Contains(t, out, "DONE\n")
		require.Less(t, st.FinishedAt.Sub(st.StartedAt), 30*time.Second, "the run was not stopped for its budget")

		res := scriptLines(out)
		worker := keyTag(providerKey)
		require.True(t, strings.HasPrefix(res["R1"], "status=200 "+worker), "R1: %s", res["R1"])
		require.Contains(t, res["R1"], `"model":"`+budgetModel+`"`)
		require.True(t, strings.HasPrefix(res["R2"], "status=200 "+worker+"body=event: message_start"), "R2: %s", res["R2"])
		require.Contains(t, res["R2"], "message_start")
		require.True(t, strings.HasPrefix(res["R3"], "status=429 key=- body="), "R3: %s", res["R3"])
		var quota struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(res["R3"], "status=429 key=- body=")), &quota), res["R3"])
		require.Equal(t, "error", quota.Type)
		require.Equal(t, "rate_limit_error", quota.Error.Type)
		require.Contains(t, quota.Error.Message, reached)

		want := messages.UsageTotals{Requests: 2, Tokens: fixtureTokens.Add(fixtureTokens), Refused: 1}
		requireUsage(t, want, 2*fixtureCostUSD, st.Usage)
		require.Equal(t, reached, st.Budget)
		require.NotNil(t, st.Receipt)
		require.Equal(t, prices.Digest, st.Receipt.Prices)
		require.True(t, strings.HasPrefix(st.Receipt.Prices, "sha256:"), st.Receipt.Prices)
		require.Equal(t, &messages.ReceiptBudgets{MaxCostUSD: 1, MaxModelRequests: 2, OnBudget: "fail"}, st.Receipt.Budgets)

		var usageEvents []messages.UsageEvent
		var budgetEvents []messages.BudgetEvent
		var finished []messages.Event
		for _, m := range all {
			require.NotContains(t, string(m.Data()), providerKey, m.Subject())
			switch m.Subject() {
			case messages.SubjectEvents(budget, messages.EventUsage):
				var ev messages.UsageEvent
				require.NoError(t, json.Unmarshal(m.Data(), &ev))
				usageEvents = append(usageEvents, ev)
			case messages.SubjectEvents(budget, messages.EventBudget):
				var ev messages.BudgetEvent
				require.NoError(t, json.Unmarshal(m.Data(), &ev))
				budgetEvents = append(budgetEvents, ev)
			case messages.SubjectEvents(budget, messages.EventFinished):
				var ev messages.Event
				require.NoError(t, json.Unmarshal(m.Data(), &ev))
				finished = append(finished, ev)
			}
		}
		require.Len(t, usageEvents, 2, "usage events: %+v", usageEvents)
		for i, ev := range usageEvents {
			require.Equal(t, budget, ev.RunID)
			require.Equal(t, "inj.provider.test", ev.Host)
			require.Equal(t, messages.FormatAnthropic, ev.Format)
			require.Equal(t, budgetModel, ev.Model)
			require.Equal(t, 200, ev.Status)
			require.Equal(t, i == 1, ev.Stream, "event %d: the second request streams", i)
			require.True(t, ev.Known, "event %d", i)
			require.Equal(t, fixtureTokens, ev.Tokens, "event %d", i)
			require.NotNil(t, ev.CostUSD, "event %d", i)
			require.InDelta(t, fixtureCostUSD, *ev.CostUSD, 1e-12, "event %d", i)
		}
		require.Len(t, budgetEvents, 1, "budget events: %+v", budgetEvents)
		b := budgetEvents[0]
		require.Equal(t, messages.BudgetEvent{RunID: budget, Time: b.Time, Budget: "max_model_requests", Limit: 2, Spent: 2,
			Action: "fail", Reason: reached}, b)
		require.Len(t, finished, 1)
		require.Equal(t, messages.StateFailed, finished[0].State)
		require.Equal(t, st.Usage, finished[0].Usage)

		data, err := json.Marshal(st)
		require.NoError(t, err)
		require.NotContains(t, string(data), providerKey)
		require.NotContains(t, out, providerKey)
	})

	t.Run("a pause longer than the stall timeout", func(t *testing.T) {
		requirePauseOutlivesStall(t, e, paused)
	})

	t.Run("a Responses incomplete loop", func(t *testing.T) { incompleteLoop(t, e, incomplete) })

	t.Run("bypass", func(t *testing.T) {
		st := waitState(t, e.url, bypass, func(s messages.RunState) bool { return s.State.Final() })
		all := eventsToFinished(t, e.js, bypass)
		out, events := egressRunOutput(t, e.js, bypass)
		require.Equal(t, messages.StateSucceeded, st.State, "%s\n%s", st.Reason, out)
		res := scriptLines(out)

		require.Equal(t, "fail", res["direct"], "the provider's address is reachable directly:\n%s", out)
		// The proxy refuses a CONNECT it does not allow with 403, which Go's
		// client reports as an error.
		require.True(t, strings.HasPrefix(res["address"], "status=error ") && strings.Contains(res["address"], "Forbidden"),
			"by address: %s", res["address"])
		require.True(t, strings.HasPrefix(res["unlisted"], "status=error ") && strings.Contains(res["unlisted"], "Forbidden"),
			"unlisted name: %s", res["unlisted"])
		require.True(t, strings.HasPrefix(res["metered"], "status=200 "+keyTag(providerKey)), "metered: %s", res["metered"])

		require.True(t, strings.HasPrefix(res["alias"], "status=error ") && strings.Contains(res["alias"], "Forbidden"),
			"another name of the metered address: %s", res["alias"])

		var refusedAddr, refusedUnlisted, refusedAlias bool
		for _, ev := range events {
			require.False(t, ev.Allowed && ev.Host != "inj.provider.test", "allowed past the metering: %+v", ev)
			switch {
			case !ev.Allowed && ev.Host == e.provider.String() && strings.Contains(ev.Reason, "address literal"):
				refusedAddr = true
			case !ev.Allowed && ev.Host == "other.provider.test" && strings.Contains(ev.Reason, "allowlist"):
				refusedUnlisted = true
			case !ev.Allowed && ev.Host == "api.provider.test" && strings.Contains(ev.Reason, "inj.provider.test, a host the proxy meters"):
				refusedAlias = true
			}
		}
		require.True(t, refusedAddr && refusedUnlisted && refusedAlias, "egress events: %+v", events)
		// Only the request to the metered name is counted.
		requireUsage(t, messages.UsageTotals{Requests: 1, Tokens: fixtureTokens}, fixtureCostUSD, st.Usage)
		require.Empty(t, st.Budget)
		data, err := json.Marshal(st)
		require.NoError(t, err)
		require.NotContains(t, string(data), providerKey)
		for _, m := range all {
			require.NotContains(t, string(m.Data()), providerKey, m.Subject())
		}
	})
}

// requirePauseOutlivesStall: a run held at its budget for far longer
// than its stall_timeout (pauseProfile) is not stopped as stalled; `jetcrew
// budget` grants it (it is running), and its held request then goes on.
func requirePauseOutlivesStall(t *testing.T, e egressEnv, id string) {
	t.Helper()
	var pausedAt time.Time
	for deadline := time.Now().Add(90 * time.Second); pausedAt.IsZero() || time.Since(pausedAt) < 3*pauseStall; time.Sleep(100 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "the run never paused")
		st := waitState(t, e.url, id, func(messages.RunState) bool { return true })
		if st.State.Final() {
			out, _ := egressRunOutput(t, e.js, id)
			t.Fatalf("the run ended while paused: %s (%s)\n%s", st.State, st.Reason, out)
		}
		if strings.HasPrefix(st.Budget, "paused: ") && pausedAt.IsZero() {
			pausedAt = time.Now()
		}
	}
	g := run(t, e.url, jetcrewBin, "budget", "--requests", "1", id)
	require.Equal(t, 0, g.code, g.stderr)
	require.Contains(t, g.stdout, "run "+id+": granted $0.0000, 0 output tokens, 1 requests")
	require.NotContains(t, g.stdout, "queued")

	st := waitState(t, e.url, id, func(s messages.RunState) bool { return s.State.Final() })
	out, _ := egressRunOutput(t, e.js, id)
	require.Equal(t, messages.StateSucceeded, st.State, "%s\n%s", st.Reason, out)
	res := scriptLines(out)
	require.True(t, strings.HasPrefix(res["P1"], "status=200 "+keyTag(providerKey)), "P1: %s", res["P1"])
	require.True(t, strings.HasPrefix(res["P2"], "status=200 "+keyTag(providerKey)), "P2 (held, then granted): %s", res["P2"])
	require.Contains(t, out, "DONE\n")
	require.NotNil(t, st.Usage)
	require.EqualValues(t, 2, st.Usage.Requests)
	require.Empty(t, st.Budget)

	g = run(t, e.url, jetcrewBin, "budget", "--requests", "1", id)
	require.Equal(t, 1, g.code, g.stdout)
	require.Contains(t, g.stderr, "run "+id+" has ended (succeeded): nothing granted")
}

// eventsToFinished returns run id's events once they include its finished
// event, which follows the final state by the time the run's container is
// removed (so every event the run published is in by then).
func eventsToFinished(t *testing.T, js jetstream.JetStream, id string) []jetstream.Msg {
	t.Helper()
	var all []jetstream.Msg
	require.Eventually(t, func() bool {
		all = workertest.Events(t, js, id)
		for _, m := range all {
			if m.Subject() == messages.SubjectEvents(id, messages.EventFinished) {
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "run %s has no finished event", id)
	return all
}

// requireUsage requires that got is want, with a cost of costUSD (to
// within float rounding).
func requireUsage(t *testing.T, want messages.UsageTotals, costUSD float64, got *messages.UsageTotals) {
	t.Helper()
	require.NotNil(t, got, "no usage in the run state")
	require.InDelta(t, costUSD, got.CostUSD, 1e-12, "cost")
	g := *got
	g.CostUSD = 0
	require.Equal(t, want, g)
}

// incompleteLoop checks the run id of incompleteLoopScript: every answer
// ended response.incomplete at max_output_tokens (streamed or not), and
// each is counted at its reported usage, so the loop nears max_cost_usd
// 0.01 after incompleteServed answers; the next request, whose worst case
// no longer fits, is refused with OpenAI's insufficient_quota and the run
// ends failed for its cost budget, within it.
func incompleteLoop(t *testing.T, e egressEnv, id string) {
	st := waitState(t, e.url, id, func(s messages.RunState) bool { return s.State.Final() })
	all := eventsToFinished(t, e.js, id)
	out, _ := egressRunOutput(t, e.js, id)
	require.Equal(t, messages.StateFailed, st.State, "%s\n%s", st.Reason, out)
	require.Contains(t, st.Reason, "budget reached: max_cost_usd 0.01", out)
	res := scriptLines(out)
	n := incompleteServed
	for i := 1; i <= n; i++ {
		r := res[fmt.Sprintf("R%d", i)]
		require.True(t, strings.HasPrefix(r, "status=200 "+keyTag(providerKey)), "R%d: %s", i, r)
		require.Contains(t, r, `"max_output_tokens":16`, "R%d", i)
		require.Contains(t, r, `"status":"`, "R%d", i)
	}
	refused := res[fmt.Sprintf("R%d", n+1)]
	require.True(t, strings.HasPrefix(refused, "status=429 key=- body="), "R%d: %s\n%s", n+1, refused, out)
	require.Contains(t, refused, "insufficient_quota")
	require.Contains(t, out, "REFUSED\n")
	require.NotContains(t, res, fmt.Sprintf("R%d", n+2))

	want := messages.UsageTotals{Requests: int64(n), Refused: 1, Tokens: messages.Tokens{Input: int64(n) * incompleteTokens.Input, Output: int64(n) * incompleteTokens.Output}}
	requireUsage(t, want, float64(n)*incompleteCostUSD, st.Usage)
	require.LessOrEqual(t, st.Usage.CostUSD, 0.01, "the run spent past its budget")
	var usageEvents []messages.UsageEvent
	var budgets []messages.BudgetEvent
	for _, m := range all {
		switch m.Subject() {
		case messages.SubjectEvents(id, messages.EventUsage):
			var ev messages.UsageEvent
			require.NoError(t, json.Unmarshal(m.Data(), &ev))
			usageEvents = append(usageEvents, ev)
		case messages.SubjectEvents(id, messages.EventBudget):
			var ev messages.BudgetEvent
			require.NoError(t, json.Unmarshal(m.Data(), &ev))
			budgets = append(budgets, ev)
		}
	}
	require.Len(t, usageEvents, n, "usage events: %+v", usageEvents)
	for i, ev := range usageEvents {
		require.Equal(t, messages.FormatOpenAIResponses, ev.Format, "event %d", i)
		require.Equal(t, "gpt-5", ev.Model, "event %d", i)
		require.Equal(t, i%2 == 1, ev.Stream, "event %d: every second request streams", i)
		require.True(t, ev.Known, "event %d: a response.incomplete carries usage", i)
		require.Equal(t, incompleteTokens, ev.Tokens, "event %d", i)
		require.NotNil(t, ev.CostUSD, "event %d", i)
		require.InDelta(t, incompleteCostUSD, *ev.CostUSD, 1e-12, "event %d", i)
	}
	require.Len(t, budgets, 1, "budget events: %+v", budgets)
	require.Equal(t, "max_cost_usd", budgets[0].Budget)
	require.InDelta(t, float64(n)*incompleteCostUSD, budgets[0].Spent, 1e-12)
}
