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
	require.Equal(t, usage.Price{Input: 3, Output: 15, CacheRead: 0.3, CacheWrite: 3.75}, p.Models["claude-sonnet-4-5"])
	require.Equal(t, usage.Price{Input: 0.15, Output: 0.6}, p.Models["gpt-4o-mini"])
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
