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

// Rates are what a model's tokens cost, in US dollars per million tokens
// of each kind (the unit of the providers' price lists). A nil rate is a
// kind the table does not price: a response with tokens of that kind is
// partly unpriced (Charge), never silently free; a rate of 0 is free.
type Rates struct {
	// Input is the price of uncached input tokens (Tokens.Input).
	Input *float64 `toml:"input"`
	// Output is the price of output tokens, reasoning included.
	Output *float64 `toml:"output"`
	// CacheRead is the price of input tokens read from the prompt cache.
	CacheRead *float64 `toml:"cache_read"`
	// CacheWrite is the price of input tokens written to the prompt cache
	// (Anthropic's 5-minute writes, 1.25 times its input price; OpenAI's
	// cache_write_tokens).
	CacheWrite *float64 `toml:"cache_write"`
	// CacheWrite1h is the price of Anthropic's one-hour cache writes
	// (Tokens.CacheWrite1h, twice its input price).
	CacheWrite1h *float64 `toml:"cache_write_1h"`
}

// Tier is a model's rates for a prompt past a size (a long-context price:
// Claude Sonnet's and Gemini 2.5 Pro's above 200,000 input tokens). It
// prices every token of such a response, not only those past the size.
type Tier struct {
	// AboveInputTokens is the size a prompt must pass, in input tokens of
	// every kind (Tokens.Input, CacheRead and CacheWrite together).
	AboveInputTokens int64 `toml:"above_input_tokens"`
	Rates
}

// Price is a model's row of the price table: its rates, its per-request
// fees, and its tiers of long prompts.
type Price struct {
	Rates
	// WebSearch is the price of the provider's web searches, in US dollars
	// per 1,000 searches (Result.WebSearches; the unit of Anthropic's and
	// OpenAI's price lists).
	WebSearch *float64 `toml:"web_search"`
	// MaxOutput is the most output tokens the model generates in one
	// answer, in tokens (not a price): what the proxy reserves for a
	// request that sets no cap of its own (Prices.Worst). 0: the
	// documented default for its family (DefaultMaxOutputs).
	MaxOutput int64 `toml:"max_output"`
	// Tiers are the long-prompt rates, sorted by AboveInputTokens.
	Tiers []Tier `toml:"tiers"`
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
// tokens (web_search: per 1,000 searches; max_output, a count of tokens,
// is the model's largest answer), and any number of tiers, each with the
// prompt size it applies above and its own token prices:
//
//	[models."claude-sonnet-4-5"]
//	input = 3.0
//	output = 15.0
//	cache_read = 0.30
//	cache_write = 3.75
//	cache_write_1h = 6.0
//	web_search = 10.0
//	max_output = 64000
//
//	[[models."claude-sonnet-4-5".tiers]]
//	above_input_tokens = 200000
//	input = 6.0
//	output = 22.5
//
// A key left out prices nothing (Charge names it for a response that
// needed it). It returns an error for TOML that does not parse, a key
// other than these (a misspelt price would otherwise go unpriced), an
// empty model name, a price that is negative, infinite or NaN, a
// negative max_output, a tier whose above_input_tokens is not positive,
// or two tiers of a model with the same one. Digest is the SHA-256 of data.
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
		if err := p.check(fmt.Sprintf("models.%q", m)); err != nil {
			return nil, fmt.Errorf("price table %s: %w", name, err)
		}
		f.Models[m] = p
	}
	sum := sha256.Sum256(data)
	return &Prices{Models: f.Models, Digest: "sha256:" + hex.EncodeToString(sum[:])}, nil
}

// check validates p, the row at key, and sorts its tiers.
func (p *Price) check(key string) error {
	if p.MaxOutput < 0 {
		return fmt.Errorf("%s.max_output = %d: a count of tokens >= 0", key, p.MaxOutput)
	}
	if err := checkRate(key+".web_search", p.WebSearch); err != nil {
		return err
	}
	if err := p.Rates.check(key); err != nil {
		return err
	}
	sort.SliceStable(p.Tiers, func(i, j int) bool { return p.Tiers[i].AboveInputTokens < p.Tiers[j].AboveInputTokens })
	for i, t := range p.Tiers {
		tk := fmt.Sprintf("%s.tiers[%d]", key, i)
		if t.AboveInputTokens <= 0 {
			return fmt.Errorf("%s.above_input_tokens = %d: a tier's bound is a count of input tokens > 0", tk, t.AboveInputTokens)
		}
		if i > 0 && p.Tiers[i-1].AboveInputTokens == t.AboveInputTokens {
			return fmt.Errorf("%s: two tiers above %d input tokens", key, t.AboveInputTokens)
		}
		if err := t.Rates.check(tk); err != nil {
			return err
		}
	}
	return nil
}

// check validates r, the rates at key.
func (r *Rates) check(key string) error {
	for _, v := range []struct {
		key  string
		rate *float64
	}{{"input", r.Input}, {"output", r.Output}, {"cache_read", r.CacheRead}, {"cache_write", r.CacheWrite}, {"cache_write_1h", r.CacheWrite1h}} {
		if err := checkRate(key+"."+v.key, v.rate); err != nil {
			return err
		}
	}
	return nil
}

// checkRate refuses a price that is negative, infinite or NaN.
func checkRate(key string, usd *float64) error {
	if usd != nil && (*usd < 0 || math.IsInf(*usd, 0) || math.IsNaN(*usd)) {
		return fmt.Errorf("%s = %v: a price is a finite number >= 0", key, *usd)
	}
	return nil
}

// Charge is what a response costs by a price table (Prices.Charge).
type Charge struct {
	// USD is the cost of what the table prices, in US dollars.
	USD float64
	// PartlyUnpriced names the prices the response needed that the row
	// (or the tier its prompt is past) lacks, in the order input, output,
	// cache_read, cache_write, cache_write_1h, web_search; a tier's are
	// named "<key> above <n> input tokens"; last, a dearer processing tier
	// (Result.Tier). USD is then a lower bound.
	PartlyUnpriced []string
}

// Charge returns what a response r costs, priced as model (r.Model is not
// used: the caller names the model it records), and false when the table
// has no row for model (nor does a nil table). The model's row is found as
// Cost finds it. A prompt past a tier's size (Input, CacheRead and
// CacheWrite together) has all its tokens priced by the highest such
// tier; the one-hour cache writes are priced at cache_write_1h and the
// rest of the writes at cache_write; r.WebSearches at web_search per
// 1,000. A kind with tokens (or searches) whose price is absent costs
// nothing and is named in PartlyUnpriced; so is r.Tier, a dearer
// processing tier than the table's rates are for.
func (p *Prices) Charge(model string, r Result) (Charge, bool) {
	t, webSearches := r.Tokens, r.WebSearches
	pr, ok := p.price(model)
	if !ok {
		return Charge{}, false
	}
	rates, tier := pr.Rates, ""
	prompt := t.Input + t.CacheRead + t.CacheWrite
	for i := len(pr.Tiers) - 1; i >= 0; i-- {
		if prompt > pr.Tiers[i].AboveInputTokens {
			rates, tier = pr.Tiers[i].Rates, fmt.Sprintf(" above %d input tokens", pr.Tiers[i].AboveInputTokens)
			break
		}
	}
	var c Charge
	add := func(key string, n int64, usd *float64, per float64) {
		switch {
		case n <= 0:
		case usd == nil:
			c.PartlyUnpriced = append(c.PartlyUnpriced, key)
		default:
			c.USD += float64(n) * *usd / per
		}
	}
	add("input"+tier, t.Input, rates.Input, 1e6)
	add("output"+tier, t.Output, rates.Output, 1e6)
	add("cache_read"+tier, t.CacheRead, rates.CacheRead, 1e6)
	add("cache_write"+tier, t.CacheWrite-min(t.CacheWrite1h, t.CacheWrite), rates.CacheWrite, 1e6)
	add("cache_write_1h"+tier, min(t.CacheWrite1h, t.CacheWrite), rates.CacheWrite1h, 1e6)
	add("web_search", webSearches, pr.WebSearch, 1e3)
	if r.Tier != "" {
		c.PartlyUnpriced = append(c.PartlyUnpriced, r.Tier)
	}
	return c, true
}

// Cost returns what t costs for model, in US dollars (Charge without web
// searches), and false when the table has no price for model (nor does a
// nil table). A model matches its exact name, else the longest table name
// that is a prefix of it followed by "-" or "@": providers answer with
// dated names ("claude-sonnet-4-5" prices "claude-sonnet-4-5-20250929",
// and Vertex AI's "claude-sonnet-4-5@20250929").
func (p *Prices) Cost(model string, t messages.Tokens) (float64, bool) {
	c, ok := p.Charge(model, Result{Tokens: t})
	return c.USD, ok
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
