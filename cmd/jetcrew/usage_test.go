package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// The usage lines say web searches, one-hour cache writes, and a cost the
// price table could price only in part as a lower bound.
func TestUsageLines(t *testing.T) {
	t.Parallel()
	require.Equal(t, "3 model requests; tokens 10 in, 7 out, 300 cache write (200 1h); 2 web searches; $0.0420 or more (1 partly priced)",
		describeUsage(messages.UsageTotals{Requests: 3, Tokens: messages.Tokens{Input: 10, Output: 7, CacheWrite: 300, CacheWrite1h: 200},
			WebSearches: 2, CostUSD: 0.042, PartlyUnpriced: 1}))

	cost := 0.042
	data, err := json.Marshal(messages.UsageEvent{Model: "claude-sonnet-4-5", Known: true, Tokens: messages.Tokens{Input: 10, Output: 7},
		WebSearches: 2, CostUSD: &cost, PartlyUnpriced: []string{"web_search"}, DurationMS: 1200})
	require.NoError(t, err)
	var b strings.Builder
	p := &runPrinter{stdout: &b, stderr: &b, atLineStart: true}
	require.NoError(t, p.printUsage(dispatcher.WatchEvent{Data: data}))
	require.Equal(t, "--- usage: claude-sonnet-4-5: 10 in, 7 out tokens, 2 web searches, $0.0420 or more (no price for web_search), 1.2s\n", b.String())
}
