package messages_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// A usage event's wire form: tokens by kind (the one-hour cache writes a
// part of cache_write), web searches, the cost and what the price table
// could not price.
func TestUsageEventWireGolden(t *testing.T) {
	t.Parallel()
	cost := 0.0421
	ev := messages.UsageEvent{RunID: "r1", Time: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC), Host: "api.anthropic.com",
		Format: messages.FormatAnthropic, Model: "claude-sonnet-4-5-20250929", Status: 200, Stream: true, Known: true,
		Tokens:      messages.Tokens{Input: 2095, Output: 503, CacheRead: 10000, CacheWrite: 2051, CacheWrite1h: 1024},
		WebSearches: 3, CostUSD: &cost, PartlyUnpriced: []string{"web_search"}, DurationMS: 5400}
	b, err := json.MarshalIndent(ev, "", "  ")
	require.NoError(t, err)
	golden(t, "event-usage.json", append(b, '\n'))
}

// UsageTotals.Add counts a response the table priced only in part as
// priced (its cost is in CostUSD) and as partly unpriced; a response of a
// model the table lacks as unpriced; one whose usage is unknown as unknown.
func TestUsageTotalsAdd(t *testing.T) {
	t.Parallel()
	usd := func(f float64) *float64 { return &f }
	var tot messages.UsageTotals
	tot.Add(messages.UsageEvent{Known: true, Tokens: messages.Tokens{Input: 10, Output: 5, CacheWrite: 4, CacheWrite1h: 3}, CostUSD: usd(0.5)})
	tot.Add(messages.UsageEvent{Known: true, Tokens: messages.Tokens{Input: 1, Output: 1}, WebSearches: 2, CostUSD: usd(0.25),
		PartlyUnpriced: []string{"web_search"}})
	tot.Add(messages.UsageEvent{Known: true, Tokens: messages.Tokens{Output: 7}, WebSearches: 1})
	tot.Add(messages.UsageEvent{})
	require.Equal(t, messages.UsageTotals{Requests: 4, Unknown: 1,
		Tokens:      messages.Tokens{Input: 11, Output: 13, CacheWrite: 4, CacheWrite1h: 3},
		WebSearches: 3, CostUSD: 0.75, Unpriced: 1, PartlyUnpriced: 1}, tot)
}
