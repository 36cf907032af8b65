package usage_test

import (
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// reserveTable has a model with every kind of price and a long-prompt
// tier dearer than its rates, one without a web search price, one without
// an output price, and one whose tier lacks an output price.
const reserveTable = `[models.full]
input = 3.0
output = 15.0
cache_read = 0.30
cache_write = 3.75
cache_write_1h = 6.0
web_search = 10.0
max_output = 1000

[[models.full.tiers]]
above_input_tokens = 200000
input = 6.0
output = 22.5
cache_write_1h = 12.0

[models.nosearch]
input = 1.0
output = 2.0

[models.nooutput]
input = 1.0

[models.tierless]
input = 1.0
output = 2.0

[[models.tierless.tiers]]
above_input_tokens = 1000
input = 2.0
`

// A request's worst case is priced at the model's dearest rates: on the
// input side the highest of input, cache reads, both cache writes, in
// the row and in every tier (here the tier's one-hour writes); on the
// output side the highest output price of the row and its tiers; plus
// the web searches the request may pay for at web_search. A price the
// worst case needs that the row lacks is named, as Charge names it.
func TestWorst(t *testing.T) {
	t.Parallel()
	p, err := usage.ParsePrices("prices.toml", []byte(reserveTable))
	require.NoError(t, err)
	for _, tc := range []struct {
		name, model string
		b           usage.Bounds
		want        usage.Worst
	}{
		{"dearest of row and tier", "full", usage.Bounds{Size: 300, MaxOutput: 100, Choices: 1},
			usage.Worst{Input: 100, Output: 100, CostUSD: (100*12.0 + 100*22.5) / 1e6, Priced: true}},
		{"web searches", "full", usage.Bounds{Size: 3, MaxOutput: 10, Choices: 2, WebSearches: 5},
			usage.Worst{Input: 1, Output: 20, WebSearches: 5, CostUSD: (1*12.0+20*22.5)/1e6 + 5*10.0/1e3, Priced: true}},
		{"no cap: max_output", "full", usage.Bounds{},
			usage.Worst{Output: 1000, CostUSD: 1000 * 22.5 / 1e6, Priced: true}},
		{"no web search, no price needed", "nosearch", usage.Bounds{Size: 30, MaxOutput: 10},
			usage.Worst{Input: 10, Output: 10, CostUSD: (10*1.0 + 10*2.0) / 1e6, Priced: true}},
		{"web search unpriced", "nosearch", usage.Bounds{Size: 30, MaxOutput: 10, WebSearches: 1},
			usage.Worst{Input: 10, Output: 10, WebSearches: 1, CostUSD: (10*1.0 + 10*2.0) / 1e6, Priced: true, Unpriced: []string{"web_search"}}},
		{"output unpriced", "nooutput", usage.Bounds{Size: 3, MaxOutput: 10},
			usage.Worst{Input: 1, Output: 10, CostUSD: 1.0 / 1e6, Priced: true, Unpriced: []string{"output"}}},
		{"a tier's output unpriced", "tierless", usage.Bounds{Size: 3, MaxOutput: 10},
			usage.Worst{Input: 1, Output: 10, CostUSD: (1*2.0 + 10*2.0) / 1e6, Priced: true, Unpriced: []string{"output above 1000 input tokens"}}},
		{"no row", "other", usage.Bounds{Size: 3, MaxOutput: 10, WebSearches: 1},
			usage.Worst{Input: 1, Output: 10, WebSearches: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := p.Worst(tc.model, tc.b)
			require.InDelta(t, tc.want.CostUSD, got.CostUSD, 1e-12)
			got.CostUSD = tc.want.CostUSD
			require.Equal(t, tc.want, got)
		})
	}
}

// ReadRequest counts the web searches a request may pay for: Anthropic's
// web search tools by their max_uses (DefaultWebSearches for one without),
// a Responses request's web search tool by its max_tool_calls (else
// DefaultWebSearches); none for a request without such a tool.
func TestReadRequestWebSearches(t *testing.T) {
	t.Parallel()
	d := int64(usage.DefaultWebSearches)
	for _, tc := range []struct {
		name, format, path, body string
		want                     int64
	}{
		{"anthropic max_uses", messages.FormatAnthropic, "/v1/messages",
			`{"model":"m","max_tokens":5,"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":3},{"name":"Bash","input_schema":{}}]}`, 3},
		{"anthropic without max_uses", messages.FormatAnthropic, "/v1/messages",
			`{"model":"m","tools":[{"type":"web_search_20250305","name":"web_search"}]}`, d},
		{"anthropic two tools", messages.FormatAnthropic, "/v1/messages",
			`{"model":"m","tools":[{"type":"web_search_20250305","max_uses":2},{"type":"web_search_20260209","max_uses":4}]}`, 6},
		{"anthropic other server tools", messages.FormatAnthropic, "/v1/messages",
			`{"model":"m","tools":[{"type":"web_fetch_20250910"},{"type":"bash_20250124","name":"bash"}]}`, 0},
		{"vertex claude", messages.FormatAnthropic, "/v1/projects/p/locations/l/publishers/anthropic/models/claude-sonnet-4-5:rawPredict",
			`{"anthropic_version":"vertex-2023-10-16","tools":[{"type":"web_search_20250305","max_uses":1}]}`, 1},
		{"responses", messages.FormatOpenAIResponses, "/v1/responses",
			`{"model":"gpt-5","tools":[{"type":"web_search"}]}`, d},
		{"responses preview, max_tool_calls", messages.FormatOpenAIResponses, "/v1/responses",
			`{"model":"gpt-5","max_tool_calls":4,"tools":[{"type":"function","name":"f"},{"type":"web_search_preview_2025_03_11"}]}`, 4},
		{"responses without web search", messages.FormatOpenAIResponses, "/v1/responses",
			`{"model":"gpt-5","max_tool_calls":4,"tools":[{"type":"function","name":"web_search"}]}`, 0},
		{"tools not a list", messages.FormatAnthropic, "/v1/messages", `{"model":"m","tools":{"type":"web_search_20250305"}}`, 0},
		{"chat", messages.FormatOpenAIChat, "/v1/chat/completions",
			`{"model":"gpt-4o","tools":[{"type":"web_search"}]}`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, b, _ := usage.ReadRequest(tc.format, tc.path, io.NopCloser(strings.NewReader(tc.body)), 1<<10)
			require.True(t, b.Whole)
			require.Equal(t, tc.want, b.WebSearches)
		})
	}
}
