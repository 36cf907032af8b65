package egress

import (
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// A response is priced with everything it billed: its one-hour cache
// writes at their own price, its web searches per 1,000; a search fee the
// table lacks marks the event and the run's totals partly unpriced, its
// cost a lower bound (never silently cheaper).
func TestMeterPartlyUnpriced(t *testing.T) {
	t.Parallel()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test-4-20250101",`+
			`"content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":10,"output_tokens":7,`+
			`"cache_read_input_tokens":0,"cache_creation_input_tokens":3000,"cache_creation":{"ephemeral_5m_input_tokens":1000,"ephemeral_1h_input_tokens":2000},`+
			`"server_tool_use":{"web_search_requests":2}}}`)
	})
	for _, tc := range []struct {
		name     string
		table    string
		cost     float64
		unpriced []string
	}{
		{name: "priced whole", table: "[models.\"claude-test-4\"]\ninput = 3\noutput = 15\ncache_write = 3.75\ncache_write_1h = 6\nweb_search = 10\n",
			cost: (10*3+7*15+1000*3.75+2000*6)/1e6 + 2*10.0/1000},
		{name: "without a search fee", table: "[models.\"claude-test-4\"]\ninput = 3\noutput = 15\ncache_write = 3.75\ncache_write_1h = 6\n",
			cost: (10*3 + 7*15 + 1000*3.75 + 2000*6) / 1e6, unpriced: []string{"web_search"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			prices, err := usage.ParsePrices("prices.toml", []byte(tc.table))
			require.NoError(t, err)
			mb := meterSetup(t, h, Metering{Prices: prices})
			resp := mb.post(t, "claude-test-4", false)
			_, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			ev := mb.waitEvents(t, 1)[0]
			require.Equal(t, messages.Tokens{Input: 10, Output: 7, CacheWrite: 3000, CacheWrite1h: 2000}, ev.Tokens)
			require.EqualValues(t, 2, ev.WebSearches)
			require.NotNil(t, ev.CostUSD)
			require.InDelta(t, tc.cost, *ev.CostUSD, 1e-12)
			require.Equal(t, tc.unpriced, ev.PartlyUnpriced)
			tot := mb.sess.Usage()
			require.EqualValues(t, 2, tot.WebSearches)
			require.InDelta(t, tc.cost, tot.CostUSD, 1e-12)
			require.Equal(t, int64(len(tc.unpriced)), tot.PartlyUnpriced)
			require.Zero(t, tot.Unpriced)
		})
	}
}
