package usage

import (
	"fmt"
	"math"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
)

// FallbackMaxOutput is the output cap reserved for a request that sets
// none, of a model neither the price table (max_output) nor
// DefaultMaxOutputs knows: the largest of DefaultMaxOutputs.
const FallbackMaxOutput = 128000

// DefaultMaxOutputs are the providers' documented maximum output tokens
// of one response, by model name prefix (the longest prefix of a model's
// name counts): what a request that sets no cap of its own may generate
// (Anthropic's models overview, OpenAI's model pages, Gemini's model
// pages). A price table's max_output for a model comes first.
var DefaultMaxOutputs = map[string]int64{
	"claude-opus-4-5":   64000,
	"claude-opus-4-1":   32000,
	"claude-opus-4":     32000,
	"claude-sonnet-4-5": 64000,
	"claude-sonnet-4":   64000,
	"claude-haiku-4-5":  64000,
	"claude-3-7-sonnet": 64000,
	"claude-3-5":        8192,
	"claude-3-opus":     4096,
	"claude-3-haiku":    4096,
	"gpt-5":             128000,
	"gpt-4.1":           32768,
	"gpt-4o":            16384,
	"gpt-4-turbo":       4096,
	"gpt-3.5-turbo":     4096,
	"o1":                100000,
	"o1-mini":           65536,
	"o3":                100000,
	"o4-mini":           100000,
	"codex-mini":        100000,
	"gemini-3":          65536,
	"gemini-2.5":        65536,
	"gemini-2.0":        8192,
	"gemini-1.5":        8192,
}

// DefaultWebSearches is the web searches reserved for a web search tool
// that sets no bound of its own (an Anthropic web_search tool without
// max_uses, a Responses request with a web_search tool and no
// max_tool_calls). It is jetcrew's bound, not the provider's: an answer
// that searches more costs more than its reservation by their fee.
const DefaultWebSearches = 20

// BytesPerInputToken is how many bytes of a request's body the proxy
// counts as one input token when it reserves a request's worst case:
// English prose runs about 4 bytes a token, code and JSON's escapes
// nearer 3, so a body's text rarely has more tokens than its bytes / 3.
// Input the body does not carry (an image billed by its size in pixels, a
// file or a previous response named by id) is not in the estimate.
const BytesPerInputToken = 3

// Worst is a model request's worst case, reserved against a run's cost
// and token budgets before it is sent (Prices.Worst).
type Worst struct {
	// Input is the input tokens estimated from the body's size (a token
	// per BytesPerInputToken bytes, rounded up).
	Input int64
	// Output is the most output tokens the answer can have: the
	// request's cap (Bounds.MaxOutput), else the model's (MaxOutput),
	// times the answers it asks for (Bounds.Choices).
	Output int64
	// WebSearches is the most web searches the request may pay for
	// (Bounds.WebSearches).
	WebSearches int64
	// CostUSD is what Input, Output and WebSearches cost at the model's
	// dearest rates (Price.dearest), in US dollars; 0 when Priced is
	// false.
	CostUSD float64
	// Priced is true when the table has a row for the model.
	Priced bool
	// Unpriced names the prices the worst case needs that the model's row
	// lacks, as Charge names them: "input", "output" (of the row, or "…
	// above <n> input tokens" of a tier), "web_search" (for a request
	// that may pay for web searches). CostUSD counts them as nothing, so
	// it is no bound then.
	Unpriced []string
}

// MaxOutput returns the most output tokens model generates in one
// answer: the table's max_output for it (matched as Cost matches), else
// DefaultMaxOutputs' longest prefix of the name, else FallbackMaxOutput.
func (p *Prices) MaxOutput(model string) int64 {
	if pr, ok := p.price(model); ok && pr.MaxOutput > 0 {
		return pr.MaxOutput
	}
	best, n := "", int64(FallbackMaxOutput)
	for prefix, max := range DefaultMaxOutputs {
		if len(prefix) > len(best) && strings.HasPrefix(model, prefix) {
			best, n = prefix, max
		}
	}
	return n
}

// Worst returns the worst case of a request for model with bounds b. A
// count that would overflow is saturated at math.MaxInt64.
func (p *Prices) Worst(model string, b Bounds) Worst {
	out := b.MaxOutput
	if out <= 0 {
		out = p.MaxOutput(model)
	}
	w := Worst{Input: b.Size/BytesPerInputToken + min(b.Size%BytesPerInputToken, 1), Output: mulSat(out, max(b.Choices, 1)), WebSearches: b.WebSearches}
	pr, ok := p.price(model)
	if !ok {
		return w
	}
	in, outRate, unpriced := pr.dearest()
	w.CostUSD, w.Priced, w.Unpriced = (float64(w.Input)*in+float64(w.Output)*outRate)/1e6, true, unpriced
	if w.WebSearches > 0 {
		if pr.WebSearch == nil {
			w.Unpriced = append(w.Unpriced, "web_search")
		} else {
			w.CostUSD += float64(w.WebSearches) * *pr.WebSearch / 1e3
		}
	}
	return w
}

// dearest returns the highest input-side price (input, cache_read,
// cache_write, cache_write_1h) and the highest output price of pr's rates
// and of every tier's: a request's prompt size is not known before it is
// answered (input its body does not carry, cached or named by id, counts
// toward a tier), so its worst case is priced as if it were past every
// tier. It names the input and output prices the row or a tier lacks.
func (pr Price) dearest() (in, out float64, unpriced []string) {
	add := func(r Rates, tier string) {
		for _, v := range []*float64{r.Input, r.CacheRead, r.CacheWrite, r.CacheWrite1h} {
			in = max(in, rate(v))
		}
		out = max(out, rate(r.Output))
		if r.Input == nil {
			unpriced = append(unpriced, "input"+tier)
		}
		if r.Output == nil {
			unpriced = append(unpriced, "output"+tier)
		}
	}
	add(pr.Rates, "")
	for _, t := range pr.Tiers {
		add(t.Rates, fmt.Sprintf(" above %d input tokens", t.AboveInputTokens))
	}
	return in, out, unpriced
}

// Tokens returns w as the tokens a response charged at its worst case
// counts: Input and Output.
func (w Worst) Tokens() messages.Tokens { return messages.Tokens{Input: w.Input, Output: w.Output} }

// rate returns r, 0 when the table leaves it out.
func rate(r *float64) float64 {
	if r == nil {
		return 0
	}
	return *r
}

// mulSat returns a*b for a, b >= 0, saturated at math.MaxInt64.
func mulSat(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}
