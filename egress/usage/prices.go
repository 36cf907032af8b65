package usage

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/jetcrew/jetcrew/messages"
)

// Price is what a model's tokens cost, in US dollars per million tokens
// of each kind (the unit of the providers' price lists).
type Price struct {
	// Input is the price of uncached input tokens (Tokens.Input).
	Input float64 `toml:"input"`
	// Output is the price of output tokens, reasoning included.
	Output float64 `toml:"output"`
	// CacheRead is the price of input tokens read from the prompt cache.
	CacheRead float64 `toml:"cache_read"`
	// CacheWrite is the price of input tokens written to the prompt cache
	// (Anthropic's cache writes; what Anthropic charges depends on the
	// cache's lifetime: give the one the agents use).
	CacheWrite float64 `toml:"cache_write"`
	// MaxOutput is the most output tokens the model generates in one
	// answer, in tokens (not a price): what the proxy reserves for a
	// request that sets no cap of its own (Prices.Worst). 0: the
	// documented default for its family (DefaultMaxOutputs).
	MaxOutput int64 `toml:"max_output"`
}

// Prices is an operator's price table, by model name (LoadPrices). A nil
// *Prices is a table with no prices.
type Prices struct {
	// Models are the prices by model name, as the providers name them in
	// requests and responses.
	Models map[string]Price
	// Digest is "sha256:" and the hex SHA-256 of the table file's bytes,
	// for receipts to name the table that priced a run.
	Digest string
}

// LoadPrices reads the TOML price table at path (ParsePrices). It returns
// an error when the file cannot be read or ParsePrices refuses it.
func LoadPrices(path string) (*Prices, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("price table: %w", err)
	}
	return ParsePrices(path, data)
}

// ParsePrices parses a TOML price table named name (for errors): one table
// per model under "models", each key a price in US dollars per million
// tokens, any key left out costing nothing:
//
//	[models."claude-sonnet-4-5"]
//	input = 3.0
//	output = 15.0
//	cache_read = 0.30
//	cache_write = 3.75
//
// It returns an error for TOML that does not parse, a key other than
// these (a misspelt price would otherwise count as free), an empty model
// name, or a price that is negative, infinite or NaN. Digest is the SHA-256
// of data.
func ParsePrices(name string, data []byte) (*Prices, error) {
	var f struct {
		Models map[string]Price `toml:"models"`
	}
	md, err := toml.Decode(string(data), &f)
	if err != nil {
		return nil, fmt.Errorf("price table %s: %w", name, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("price table %s: unknown keys: %s", name, strings.Join(keys, ", "))
	}
	models := make([]string, 0, len(f.Models))
	for m := range f.Models {
		models = append(models, m)
	}
	sort.Strings(models)
	for _, m := range models {
		if m == "" {
			return nil, fmt.Errorf("price table %s: a model with an empty name", name)
		}
		p := f.Models[m]
		if p.MaxOutput < 0 {
			return nil, fmt.Errorf("price table %s: models.%q.max_output = %d: a count of tokens >= 0", name, m, p.MaxOutput)
		}
		for _, v := range []struct {
			key string
			usd float64
		}{{"input", p.Input}, {"output", p.Output}, {"cache_read", p.CacheRead}, {"cache_write", p.CacheWrite}} {
			if v.usd < 0 || math.IsInf(v.usd, 0) || math.IsNaN(v.usd) {
				return nil, fmt.Errorf("price table %s: models.%q.%s = %v: a price is a finite number >= 0", name, m, v.key, v.usd)
			}
		}
	}
	sum := sha256.Sum256(data)
	return &Prices{Models: f.Models, Digest: "sha256:" + hex.EncodeToString(sum[:])}, nil
}

// Cost returns what t costs for model, in US dollars, and false when the
// table has no price for model (nor does a nil table). A model matches its
// exact name, else the longest table name that is a prefix of it followed
// by "-" or "@": providers answer with dated names ("claude-sonnet-4-5"
// prices "claude-sonnet-4-5-20250929", and Vertex AI's
// "claude-sonnet-4-5@20250929").
func (p *Prices) Cost(model string, t messages.Tokens) (float64, bool) {
	pr, ok := p.price(model)
	if !ok {
		return 0, false
	}
	usd := float64(t.Input)*pr.Input + float64(t.Output)*pr.Output +
		float64(t.CacheRead)*pr.CacheRead + float64(t.CacheWrite)*pr.CacheWrite
	return usd / 1e6, true
}

// price returns model's price by Cost's matching.
func (p *Prices) price(model string) (Price, bool) {
	if p == nil || model == "" {
		return Price{}, false
	}
	if pr, ok := p.Models[model]; ok {
		return pr, true
	}
	best, found := "", false
	for name := range p.Models {
		if len(name) >= len(model) || (found && len(name) <= len(best)) || !strings.HasPrefix(model, name) {
			continue
		}
		if c := model[len(name)]; c == '-' || c == '@' {
			best, found = name, true
		}
	}
	if !found {
		return Price{}, false
	}
	return p.Models[best], true
}
