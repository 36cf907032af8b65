package egress

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// googleStandIn answers Gemini CLI's Code Assist endpoint and Claude on
// Vertex AI's rawPredict, each in its own format, with 10 input and 5
// output tokens.
func googleStandIn(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	switch {
	case strings.HasSuffix(r.URL.Path, "/v1internal:generateContent"):
		_, _ = io.WriteString(w, `{"response":{"candidates":[{"content":{"parts":[{"text":"hi"}]}}],"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":5},"modelVersion":"gemini-2.5-pro"}}`)
	case strings.HasSuffix(r.URL.Path, ":rawPredict"):
		_, _ = io.WriteString(w, `{"type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":10,"output_tokens":5}}`)
	default:
		http.NotFound(w, r)
	}
}

// Under a cost budget, a Code Assist request (the model in the body's
// "model", its output cap in request.generationConfig) and a Claude on
// Vertex AI rawPredict (the model in the path) are priced and reserved
// by what they name: not refused as naming no model, and reserved at
// their own output cap (without it, the model's documented maximum would
// not fit the budget).
func TestMeterCodeAssistAndVertexUnderCostBudget(t *testing.T) {
	t.Parallel()
	prices := mustPrices(`[models."gemini-2.5-pro"]
input = 1.25
output = 10.0

[models."claude-sonnet-4-5"]
input = 3.0
output = 15.0
`)
	// 0.01 USD: a request capped at 100 output tokens fits; one reserved
	// at its model's maximum (65536 or 64000 tokens) does not.
	mb := meterSetup(t, http.HandlerFunc(googleStandIn), Metering{Prices: prices, Limits: Limits{MaxCostUSD: 0.01}})
	for _, c := range []struct{ name, path, body, model, format string }{
		{"code assist", "/v1internal:generateContent",
			`{"model":"gemini-2.5-pro","project":"p-1","request":{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"generationConfig":{"maxOutputTokens":100}}}`,
			"gemini-2.5-pro", messages.FormatGeminiCodeAssist},
		{"vertex claude", "/v1/projects/p-1/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:rawPredict",
			`{"anthropic_version":"vertex-2023-10-16","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`,
			"claude-sonnet-4-5", messages.FormatAnthropic},
	} {
		status, body, _ := mb.send(t, "POST", c.path, c.body, "Content-Type", "application/json")
		require.Equal(t, http.StatusOK, status, "%s: %s", c.name, body)
	}
	evs := mb.waitEvents(t, 2)
	require.Equal(t, messages.FormatGeminiCodeAssist, evs[0].Format)
	require.Equal(t, messages.FormatAnthropic, evs[1].Format)
	for i, ev := range evs {
		require.True(t, ev.Known, "event %d", i)
		require.False(t, ev.Estimated, "event %d", i)
		require.NotNil(t, ev.CostUSD, "event %d: priced", i)
	}
	require.InDelta(t, (10*1.25+5*10.0)/1e6, *evs[0].CostUSD, 1e-12)
	require.InDelta(t, (10*3.0+5*15.0)/1e6, *evs[1].CostUSD, 1e-12)
	require.Zero(t, mb.sess.Usage().Refused)

	// Without the cap its model's maximum is reserved, which the budget
	// cannot hold: the request is refused for the budget, not its model.
	status, body, _ := mb.send(t, "POST", "/v1internal:generateContent",
		`{"model":"gemini-2.5-pro","request":{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}}`)
	require.Equal(t, http.StatusTooManyRequests, status, body)
	require.Contains(t, body, "RESOURCE_EXHAUSTED")
	require.Contains(t, body, "max_cost_usd")
}

// richPrices prices model "m" with a one-hour cache write dearer than its
// input, a long-prompt tier dearer than its output and web searches, and
// model "ns" without a web search price.
var richPrices = mustPrices(`[models.m]
input = 1.0
output = 10.0
cache_write_1h = 100.0
web_search = 10.0

[[models.m.tiers]]
above_input_tokens = 100000
input = 2.0
output = 50.0

[models.ns]
input = 1.0
output = 10.0
`)

// searchStandIn answers a Messages request, as the model it names, with
// 10 input and 5 output tokens and one web search.
func searchStandIn(w http.ResponseWriter, r *http.Request) {
	var req struct{ Model string }
	_ = json.NewDecoder(r.Body).Decode(&req)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"type":"message","model":%q,"usage":{"input_tokens":10,"output_tokens":5,"server_tool_use":{"web_search_requests":1}}}`, req.Model)
}

// A request's worst case is priced at its model's dearest rates (the
// one-hour cache write on the input side, the long-prompt tier's output),
// plus the web searches its web search tool may make (max_uses); under
// max_cost_usd a request that may search on a model without a web_search
// price is refused naming it.
func TestMeterWorstCaseDearestRates(t *testing.T) {
	t.Parallel()
	mb := meterSetup(t, http.HandlerFunc(searchStandIn), Metering{Prices: richPrices, Limits: Limits{MaxCostUSD: 0.03}})
	search := func(n int) string {
		return fmt.Sprintf(`"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":%d}]`, n)
	}
	refused := []struct{ name, body string }{
		// 1000 output tokens: 0.01 USD at output, 0.05 at the tier's.
		{"tier output", `{"model":"m","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}`},
		// About 1000 input tokens: 0.001 USD at input, 0.1 at the one-hour write.
		{"one-hour write", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"` + strings.Repeat("x", 3000) + `"}]}`},
		// 5 searches: 0.05 USD.
		{"web searches", `{"model":"m","max_tokens":10,` + search(5) + `,"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, r := range refused {
		status, body, _ := mb.send(t, "POST", "/v1/messages", r.body, "anthropic-version", "2023-06-01")
		require.Equal(t, http.StatusTooManyRequests, status, "%s: %s", r.name, body)
		require.Contains(t, body, "this request may cost up to", r.name)
	}
	status, body, _ := mb.send(t, "POST", "/v1/messages", `{"model":"ns","max_tokens":10,`+search(1)+`,"messages":[]}`, "anthropic-version", "2023-06-01")
	require.Equal(t, http.StatusForbidden, status, body)
	require.Contains(t, body, `model \"ns\" has no web_search price`)

	// One search fits: 0.01 USD and its tokens.
	status, body, _ = mb.send(t, "POST", "/v1/messages", `{"model":"m","max_tokens":10,`+search(1)+`,"messages":[{"role":"user","content":"hi"}]}`, "anthropic-version", "2023-06-01")
	require.Equal(t, http.StatusOK, status, body)
	status, body, _ = mb.send(t, "POST", "/v1/messages", `{"model":"ns","max_tokens":10,"messages":[]}`, "anthropic-version", "2023-06-01")
	require.Equal(t, http.StatusOK, status, body)
	evs := mb.waitEvents(t, 2)
	require.EqualValues(t, 1, evs[0].WebSearches)
	require.InDelta(t, (10*1.0+5*10.0)/1e6+10.0/1e3, *evs[0].CostUSD, 1e-12)
	require.Equal(t, []string{"web_search"}, evs[1].PartlyUnpriced, "ns searched (without a tool the proxy saw) and has no price for it")
	require.EqualValues(t, len(refused)+1, mb.sess.Usage().Refused)
}

// A response charged its worst case counts the web searches reserved
// with its tokens and cost (its fee is in the cost).
func TestChargeWorstCountsSearches(t *testing.T) {
	t.Parallel()
	ev := messages.UsageEvent{Known: true, Tokens: messages.Tokens{Input: 4, Output: 3}}
	chargeWorst(&ev, usage.Worst{Input: 10, Output: 100, WebSearches: 2, CostUSD: 0.5, Priced: true})
	require.True(t, ev.Estimated)
	require.Equal(t, messages.Tokens{Input: 10, Output: 100}, ev.Tokens)
	require.EqualValues(t, 2, ev.WebSearches)
	require.InDelta(t, 0.5, *ev.CostUSD, 1e-12)
}
