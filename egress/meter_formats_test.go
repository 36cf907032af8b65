package egress

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

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
