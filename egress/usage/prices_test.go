package usage_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

const priceTable = `# USD per million tokens
[models."claude-sonnet-4-5"]
input = 3.0
output = 15.0
cache_read = 0.30
cache_write = 3.75

[models.claude-sonnet-4]
input = 3
output = 15

[models."gpt-4o"]
input = 2.5
output = 10.0
cache_read = 1.25

[models."gpt-4o-mini"]
input = 0.15
output = 0.60

[models."gemini-2.5-pro"]
input = 1.25
output = 10
cache_read = 0.31
`

func TestLoadPrices(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "prices.toml")
	require.NoError(t, os.WriteFile(path, []byte(priceTable), 0o600))
	p, err := usage.LoadPrices(path)
	require.NoError(t, err)
	sum := sha256.Sum256([]byte(priceTable))
	require.Equal(t, "sha256:"+hex.EncodeToString(sum[:]), p.Digest)
	require.Equal(t, usage.Price{Rates: usage.Rates{Input: usd(3), Output: usd(15), CacheRead: usd(0.3), CacheWrite: usd(3.75)}}, p.Models["claude-sonnet-4-5"])
	require.Equal(t, usage.Price{Rates: usage.Rates{Input: usd(0.15), Output: usd(0.6)}}, p.Models["gpt-4o-mini"])
	require.Len(t, p.Models, 5)

	_, err = usage.LoadPrices(filepath.Join(t.TempDir(), "missing.toml"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestParsePricesErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, toml, err string
	}{
		{"unknown key", "[models.m]\ninput = 1\ncached_read = 0.1\n", `unknown keys: models.m.cached_read`},
		{"unknown table", "[model.m]\ninput = 1\n", `unknown keys: model`},
		{"unknown top-level key", "currency = \"EUR\"\n", `unknown keys: currency`},
		{"negative", "[models.m]\ninput = 1\noutput = -15\n", `models."m".output = -15`},
		{"infinite", "[models.m]\ncache_write = inf\n", `models."m".cache_write = +Inf`},
		{"NaN", "[models.m]\ncache_read = nan\n", `models."m".cache_read = NaN`},
		{"not a number", "[models.m]\ninput = \"3\"\n", `prices.toml`},
		{"not TOML", "[models.m\n", `prices.toml`},
		{"empty name", "[models.\"\"]\ninput = 1\n", `empty name`},
		{"negative max_output", "[models.m]\ninput = 1\nmax_output = -1\n", `models."m".max_output = -1`},
		{"max_output in a tier", "[models.m]\ninput = 1\n[[models.m.tiers]]\nabove_input_tokens = 10\nmax_output = 5\n", `unknown keys: models.m.tiers.max_output`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := usage.ParsePrices("prices.toml", []byte(tc.toml))
			require.ErrorContains(t, err, tc.err)
		})
	}
}

func TestParsePricesEmpty(t *testing.T) {
	t.Parallel()
	p, err := usage.ParsePrices("empty.toml", nil)
	require.NoError(t, err)
	_, ok := p.Cost("gpt-4o", messages.Tokens{Input: 1})
	require.False(t, ok)
}

func TestCost(t *testing.T) {
	t.Parallel()
	p, err := usage.ParsePrices("prices.toml", []byte(priceTable))
	require.NoError(t, err)
	million := messages.Tokens{Input: 1e6, Output: 1e6, CacheRead: 1e6, CacheWrite: 1e6}
	for _, tc := range []struct {
		model string
		t     messages.Tokens
		want  float64
		ok    bool
	}{
		{"claude-sonnet-4-5", million, 3 + 15 + 0.3 + 3.75, true},
		{"claude-sonnet-4-5", messages.Tokens{Input: 2095, Output: 503, CacheRead: 10000, CacheWrite: 2051}, (2095*3 + 503*15 + 10000*0.3 + 2051*3.75) / 1e6, true},
		// Dated names match the longest key they extend with "-" or "@".
		{"claude-sonnet-4-5-20250929", million, 3 + 15 + 0.3 + 3.75, true},
		{"claude-sonnet-4-5@20250929", million, 3 + 15 + 0.3 + 3.75, true},
		{"claude-sonnet-4-20250514", million, 18, true},
		{"gpt-4o-2024-08-06", million, 2.5 + 10 + 1.25, true},
		{"gpt-4o-mini-2024-07-18", million, 0.75, true},
		{"gpt-4o-mini", million, 0.75, true},
		// No match: not a prefix at a separator, another model, empty.
		{"gpt-4o1", million, 0, false},
		{"claude-sonnet-4.5", million, 0, false},
		{"gpt-4", million, 0, false},
		{"gemini-2.5-flash", million, 0, false},
		{"models/gemini-2.5-pro", million, 0, false},
		{"", million, 0, false},
		{"gemini-2.5-pro", messages.Tokens{}, 0, true},
	} {
		got, ok := p.Cost(tc.model, tc.t)
		require.Equal(t, tc.ok, ok, tc.model)
		require.InDelta(t, tc.want, got, 1e-12, tc.model)
	}
}

func TestCostNilTable(t *testing.T) {
	t.Parallel()
	var p *usage.Prices
	got, ok := p.Cost("claude-sonnet-4-5", messages.Tokens{Input: 100})
	require.False(t, ok)
	require.Zero(t, got)
	got, ok = (&usage.Prices{}).Cost("claude-sonnet-4-5", messages.Tokens{Input: 100})
	require.False(t, ok)
	require.Zero(t, got)
}

// pricesWithTiers prices one-hour cache writes, web searches and long
// prompts (Anthropic's and Google's published rates).
const pricesWithTiers = `[models."claude-sonnet-4-5"]
input = 3.0
output = 15.0
cache_read = 0.30
cache_write = 3.75
cache_write_1h = 6.0
web_search = 10.0

[[models."claude-sonnet-4-5".tiers]]
above_input_tokens = 200000
input = 6.0
output = 22.5
cache_read = 0.60
cache_write = 7.50
cache_write_1h = 12.0

[models."gemini-2.5-pro"]
input = 1.25
output = 10.0
cache_read = 0.31

[[models."gemini-2.5-pro".tiers]]
above_input_tokens = 200000
input = 2.50
output = 15.0

[models."gpt-5"]
input = 1.25
output = 10.0
cache_read = 0.125
cache_write = 0
web_search = 10.0
`

// The price table takes one-hour cache writes, web searches and tiers of
// long prompts (sorted by their bound).
func TestParsePricesTiersAndFees(t *testing.T) {
	t.Parallel()
	p, err := usage.ParsePrices("prices.toml", []byte(pricesWithTiers))
	require.NoError(t, err)
	require.Len(t, p.Models, 3)
	_, ok := p.Cost("claude-sonnet-4-5-20250929", messages.Tokens{Input: 1})
	require.True(t, ok)
	require.Equal(t, usage.Price{
		Rates:     usage.Rates{Input: usd(3), Output: usd(15), CacheRead: usd(0.3), CacheWrite: usd(3.75), CacheWrite1h: usd(6)},
		WebSearch: usd(10),
		Tiers: []usage.Tier{{AboveInputTokens: 200000,
			Rates: usage.Rates{Input: usd(6), Output: usd(22.5), CacheRead: usd(0.6), CacheWrite: usd(7.5), CacheWrite1h: usd(12)}}},
	}, p.Models["claude-sonnet-4-5"])
	require.Equal(t, usd(0), p.Models["gpt-5"].CacheWrite, "0 is a price")

	two, err := usage.ParsePrices("two.toml", []byte("[models.m]\ninput = 1\n[[models.m.tiers]]\nabove_input_tokens = 500\ninput = 3\n"+
		"[[models.m.tiers]]\nabove_input_tokens = 100\ninput = 2\n"))
	require.NoError(t, err)
	require.Equal(t, []int64{100, 500}, []int64{two.Models["m"].Tiers[0].AboveInputTokens, two.Models["m"].Tiers[1].AboveInputTokens})
	for _, tc := range []struct {
		prompt int64
		want   float64
	}{{100, 100}, {101, 202}, {500, 1000}, {501, 1503}} {
		got, ok := two.Cost("m", messages.Tokens{Input: tc.prompt})
		require.True(t, ok)
		require.InDelta(t, tc.want/1e6, got, 1e-15, "prompt %d", tc.prompt)
	}
}

// usd returns a pointer to a price.
func usd(f float64) *float64 { return &f }

// Charge prices every kind a response has, by the model's row or by the
// tier its prompt is past, and names each kind the table does not price
// (which then costs nothing: the charge is a lower bound).
func TestCharge(t *testing.T) {
	t.Parallel()
	p, err := usage.ParsePrices("prices.toml", []byte(pricesWithTiers))
	require.NoError(t, err)
	flat, err := usage.ParsePrices("flat.toml", []byte(priceTable))
	require.NoError(t, err)
	for _, tc := range []struct {
		name     string
		p        *usage.Prices
		model    string
		t        messages.Tokens
		searches int64
		want     float64
		unpriced []string
	}{
		{name: "one-hour cache writes at their own price", p: p, model: "claude-sonnet-4-5-20250929",
			t:    messages.Tokens{Input: 1000, Output: 500, CacheRead: 10000, CacheWrite: 3000, CacheWrite1h: 2000},
			want: (1000*3 + 500*15 + 10000*0.30 + 1000*3.75 + 2000*6.0) / 1e6},
		{name: "one-hour cache writes the table does not price", p: flat, model: "claude-sonnet-4-5",
			t:        messages.Tokens{Input: 1000, Output: 500, CacheWrite: 3000, CacheWrite1h: 2000},
			want:     (1000*3 + 500*15 + 1000*3.75) / 1e6,
			unpriced: []string{"cache_write_1h"}},
		{name: "web searches per thousand", p: p, model: "claude-sonnet-4-5", t: messages.Tokens{Input: 100, Output: 10}, searches: 3,
			want: (100*3+10*15)/1e6 + 3*10.0/1000},
		{name: "web searches the table does not price", p: flat, model: "gpt-4o", t: messages.Tokens{Input: 100, Output: 10}, searches: 2,
			want: (100*2.5 + 10*10) / 1e6, unpriced: []string{"web_search"}},
		{name: "a prompt at the tier's bound is priced by the row", p: p, model: "claude-sonnet-4-5",
			t:    messages.Tokens{Input: 100000, CacheRead: 99000, CacheWrite: 1000, Output: 1000},
			want: (100000*3 + 99000*0.30 + 1000*3.75 + 1000*15) / 1e6},
		{name: "a prompt past the tier's bound is priced by the tier, every kind", p: p, model: "claude-sonnet-4-5",
			t:    messages.Tokens{Input: 100000, CacheRead: 99000, CacheWrite: 1001, CacheWrite1h: 1, Output: 1000},
			want: (100000*6 + 99000*0.60 + 1000*7.50 + 1*12.0 + 1000*22.5) / 1e6},
		{name: "a tier that does not price a kind the response has", p: p, model: "gemini-2.5-pro",
			t:        messages.Tokens{Input: 150000, CacheRead: 60000, Output: 2000},
			want:     (150000*2.50 + 2000*15) / 1e6,
			unpriced: []string{"cache_read above 200000 input tokens"}},
		{name: "below the tier the row prices it", p: p, model: "gemini-2.5-pro",
			t:    messages.Tokens{Input: 150000, CacheRead: 50000, Output: 2000},
			want: (150000*1.25 + 50000*0.31 + 2000*10) / 1e6},
		{name: "a price of 0 is free, not unpriced", p: p, model: "gpt-5", t: messages.Tokens{Input: 10, CacheWrite: 5000},
			want: 10 * 1.25 / 1e6},
		{name: "kinds a row lacks", p: flat, model: "gpt-4o-mini", t: messages.Tokens{Input: 10, Output: 1, CacheRead: 5, CacheWrite: 7},
			want: (10*0.15 + 1*0.60) / 1e6, unpriced: []string{"cache_read", "cache_write"}},
		{name: "a kind a row lacks, with no tokens of it", p: flat, model: "gpt-4o-mini", t: messages.Tokens{Input: 10, Output: 1},
			want: (10*0.15 + 1*0.60) / 1e6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, ok := tc.p.Charge(tc.model, usage.Result{Tokens: tc.t, WebSearches: tc.searches})
			require.True(t, ok)
			require.InDelta(t, tc.want, got.USD, 1e-12)
			require.Equal(t, tc.unpriced, got.PartlyUnpriced)
			usd, ok := tc.p.Cost(tc.model, tc.t)
			require.True(t, ok)
			if tc.searches == 0 {
				require.InDelta(t, tc.want, usd, 1e-12, "Cost is Charge without searches")
			}
		})
	}
	_, ok := p.Charge("claude-opus-4-1", usage.Result{Tokens: messages.Tokens{Input: 1}, WebSearches: 1})
	require.False(t, ok, "a model the table has no row for")
	var none *usage.Prices
	_, ok = none.Charge("claude-sonnet-4-5", usage.Result{Tokens: messages.Tokens{Input: 1}})
	require.False(t, ok)

	// A dearer tier than the standard one: priced at the table's rates, a
	// lower bound.
	got, ok := p.Charge("gpt-5", usage.Result{Model: "other", Tokens: messages.Tokens{Input: 1000}, Tier: "service_tier priority"})
	require.True(t, ok, "the model priced is the one named, not the Result's")
	require.InDelta(t, 1000*1.25/1e6, got.USD, 1e-12)
	require.Equal(t, []string{"service_tier priority"}, got.PartlyUnpriced)
}

func TestParsePricesTierErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, toml, err string
	}{
		{"a tier without its bound", "[models.m]\ninput = 1\n[[models.m.tiers]]\ninput = 2\n", `models."m".tiers[0].above_input_tokens = 0: a tier's bound is a count of input tokens > 0`},
		{"a negative bound", "[models.m]\n[[models.m.tiers]]\nabove_input_tokens = -5\n", `above_input_tokens = -5`},
		{"two tiers with one bound", "[models.m]\n[[models.m.tiers]]\nabove_input_tokens = 5\n[[models.m.tiers]]\nabove_input_tokens = 5\n",
			`models."m": two tiers above 5 input tokens`},
		{"a negative tier price", "[models.m]\n[[models.m.tiers]]\nabove_input_tokens = 5\noutput = -1\n", `models."m".tiers[0].output = -1`},
		{"a search fee in a tier", "[models.m]\n[[models.m.tiers]]\nabove_input_tokens = 5\nweb_search = 10\n", `unknown keys: models.m.tiers.web_search`},
		{"a misspelt one-hour price", "[models.m]\ncache_write_1hr = 6\n", `unknown keys: models.m.cache_write_1hr`},
		{"a NaN search fee", "[models.m]\nweb_search = nan\n", `models."m".web_search = NaN`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := usage.ParsePrices("prices.toml", []byte(tc.toml))
			require.ErrorContains(t, err, tc.err)
		})
	}
}
