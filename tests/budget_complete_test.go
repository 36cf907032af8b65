package tests

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// chatCostUSD is what the stand-in's chat answer (13 input, 4 output
// tokens) costs by budgetPrices.
const chatCostUSD = (13*2.5 + 4*10.0) / 1e6

// refusal returns the message of the provider-shaped 403 in line (a
// post's "status=403 key=- body=..."), failing unless it is one that
// never reached the provider.
func refusal(t *testing.T, name, line string) string {
	t.Helper()
	body, ok := strings.CutPrefix(line, "status=403 key=- body=")
	require.True(t, ok, "%s: %s", name, line)
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &e), "%s: %s", name, line)
	return e.Error.Type + ": " + e.Error.Message
}

// checkComplete checks the run of completeScript (TestEgressBudget).
func checkComplete(t *testing.T, e egressEnv, id string) {
	st := waitState(t, e.url, id, func(s messages.RunState) bool { return s.State.Final() })
	all := eventsToFinished(t, e.js, id)
	out, events := egressRunOutput(t, e.js, id)
	require.Equal(t, messages.StateSucceeded, st.State, "no refusal here ends the run: %s\n%s", st.Reason, out)
	require.Contains(t, out, "DONE\n")
	res := scriptLines(out)
	worker := keyTag(providerKey)

	t.Run("stream without include_usage", func(t *testing.T) {
		chat := res["CHAT"]
		require.True(t, strings.HasPrefix(chat, "status=200 "+strings.TrimSuffix(worker, " ")+" usage=true body="),
			"the provider was asked for usage: %s", chat)
		require.Contains(t, chat, `"content":"ok"`)
		require.True(t, strings.HasSuffix(chat, `data: [DONE]`), chat)
		require.NotContains(t, chat, `"usage":{`, "the client gets no usage chunk it did not ask for")
		require.NotContains(t, chat, `"choices":[]`)
	})
	t.Run("unmetered path", func(t *testing.T) {
		msg := refusal(t, "UNMETERED", res["UNMETERED"])
		require.Contains(t, msg, "permission_error: jetcrew: refused: POST /v1/completions is not a model request the proxy meters")
		require.Contains(t, msg, "egress_unmetered_paths")
		require.True(t, strings.HasPrefix(res["LISTED"], "status=200 "+worker+"body=provider ok"), "the listed path passes: %s", res["LISTED"])
		require.NotNil(t, st.Receipt)
		require.Equal(t, []string{"POST /v1/embeddings"}, st.Receipt.EgressUnmeteredPaths)
	})
	t.Run("unpriced model", func(t *testing.T) {
		msg := refusal(t, "UNPRICED", res["UNPRICED"])
		require.Contains(t, msg, `permission_error: jetcrew: refused: model "mystery-model-1" has no price`)
	})
	t.Run("websocket upgrade", func(t *testing.T) {
		msg := refusal(t, "WS", res["WS"])
		require.Contains(t, msg, `protocol upgrade (Upgrade: "websocket")`)
	})

	// The chat stream and the listed path reached the provider; three
	// requests were refused, each an egress event with its reason.
	requireUsage(t, messages.UsageTotals{Requests: 2, Unknown: 1, Tokens: messages.Tokens{Input: 13, Output: 4}, Refused: 3}, chatCostUSD, st.Usage)
	require.Empty(t, st.Budget)
	var refused []string
	for _, ev := range events {
		if !ev.Allowed && ev.Host == "inj.provider.test" {
			refused = append(refused, ev.Reason)
		}
	}
	require.Len(t, refused, 3, "egress events: %+v", events)
	var chatEvents int
	for _, m := range all {
		require.NotContains(t, string(m.Data()), providerKey, m.Subject())
		if m.Subject() != messages.SubjectEvents(id, messages.EventUsage) {
			continue
		}
		var ev messages.UsageEvent
		require.NoError(t, json.Unmarshal(m.Data(), &ev))
		if ev.Format == messages.FormatOpenAIChat {
			chatEvents++
			require.True(t, ev.Known && ev.Stream && !ev.Estimated, "%+v", ev)
			require.Equal(t, messages.Tokens{Input: 13, Output: 4}, ev.Tokens)
		}
	}
	require.Equal(t, 1, chatEvents)
}

// checkOvershoot checks the run of overScript (TestEgressBudget).
func checkOvershoot(t *testing.T, e egressEnv, id string) {
	st := waitState(t, e.url, id, func(s messages.RunState) bool { return s.State.Final() })
	eventsToFinished(t, e.js, id)
	out, _ := egressRunOutput(t, e.js, id)
	res := scriptLines(out)
	require.True(t, strings.HasPrefix(res["FIRST"], "status=200 "), "FIRST: %s", res["FIRST"])
	require.Equal(t, messages.StateFailed, st.State, "%s\n%s", st.Reason, out)
	require.Contains(t, st.Reason, "budget reached: max_cost_usd 1 (spent 0.99", out)
	require.Less(t, st.FinishedAt.Sub(st.StartedAt), 45*time.Second, "the run was not stopped for its budget")
	require.NotNil(t, st.Usage)
	t.Logf("MANY %s; spent %.6f USD of 1 in %d requests (%d estimated); reason %q", res["MANY"], st.Usage.CostUSD, st.Usage.Requests, st.Usage.Estimated, st.Reason)
	require.LessOrEqual(t, st.Usage.CostUSD, 1.0, "overshot max_cost_usd")
	require.Greater(t, st.Usage.CostUSD, 0.99)
	require.Positive(t, st.Usage.Refused)
	require.Equal(t, &messages.ReceiptBudgets{MaxCostUSD: 1, OnBudget: "fail"}, st.Receipt.Budgets)
}
