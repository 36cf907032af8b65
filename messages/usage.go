package messages

import (
	"strconv"
	"time"
)

// Tokens counts a model response's tokens by kind, as the provider reported
// them: Anthropic Messages' usage (input_tokens, output_tokens,
// cache_read_input_tokens, cache_creation_input_tokens, of which
// cache_creation.ephemeral_1h_input_tokens are CacheWrite1h), OpenAI's
// usage (prompt_tokens or input_tokens, of which the details' cached_tokens
// are CacheRead and cache_write_tokens CacheWrite, neither counted in
// Input; completion_tokens or output_tokens), Gemini's usageMetadata
// (promptTokenCount, of which cachedContentTokenCount is CacheRead, plus
// toolUsePromptTokenCount; candidatesTokenCount plus thoughtsTokenCount).
// Input never includes the cache kinds, so Input, Output, CacheRead and
// CacheWrite add up to what was billed (CacheWrite1h is a part of
// CacheWrite).
type Tokens struct {
	// Input counts the uncached input (prompt) tokens.
	Input int64 `json:"input"`
	// Output counts the generated tokens, reasoning included.
	Output int64 `json:"output"`
	// CacheRead counts input tokens read from the provider's prompt cache.
	CacheRead int64 `json:"cache_read,omitempty"`
	// CacheWrite counts input tokens written to the provider's prompt cache
	// (Anthropic's cache_creation_input_tokens, OpenAI's cache_write_tokens).
	CacheWrite int64 `json:"cache_write,omitempty"`
	// CacheWrite1h counts the part of CacheWrite written for an hour
	// (Anthropic's cache_creation.ephemeral_1h_input_tokens), which Anthropic
	// bills at twice the input price where a 5-minute write is 1.25 times.
	CacheWrite1h int64 `json:"cache_write_1h,omitempty"`
}

// Add returns t plus u, kind by kind.
func (t Tokens) Add(u Tokens) Tokens {
	return Tokens{Input: t.Input + u.Input, Output: t.Output + u.Output,
		CacheRead: t.CacheRead + u.CacheRead, CacheWrite: t.CacheWrite + u.CacheWrite,
		CacheWrite1h: t.CacheWrite1h + u.CacheWrite1h}
}

// Model API formats the egress proxy meters (UsageEvent.Format), told
// apart by the request's path.
const (
	// FormatAnthropic is Anthropic's Messages API (POST /v1/messages), and
	// the same API on Vertex AI (POST
	// .../publishers/anthropic/models/<model>:rawPredict or
	// :streamRawPredict, the model in the path).
	FormatAnthropic = "anthropic-messages"
	// FormatOpenAIChat is OpenAI's Chat Completions API (POST
	// .../chat/completions).
	FormatOpenAIChat = "openai-chat"
	// FormatOpenAIResponses is OpenAI's Responses API (POST .../responses).
	FormatOpenAIResponses = "openai-responses"
	// FormatGemini is Gemini's generateContent and streamGenerateContent
	// (POST .../models/<model>:generateContent).
	FormatGemini = "gemini"
	// FormatGeminiCodeAssist is the Code Assist API Gemini CLI uses when
	// logged in with a Google account (POST .../v1internal:generateContent
	// and :streamGenerateContent): the model is in the body's "model", and
	// each response is Gemini's wrapped as {"response": {...}}.
	FormatGeminiCodeAssist = "gemini-code-assist"
)

// UsageEvent is the body of an EventUsage: one model response through the
// run's egress proxy to a host it injects a key for, with the usage the
// provider reported in it. It is published when the response ends.
type UsageEvent struct {
	// RunID is the run.
	RunID string `json:"run_id"`
	// Time is when the request was sent.
	Time time.Time `json:"time"`
	// Host is the model API's host name.
	Host string `json:"host"`
	// Format is the API's format (FormatAnthropic, ...); empty for a
	// request to an injected host that is no model request the proxy
	// knows (counted, with Known false).
	Format string `json:"format,omitempty"`
	// Model is the model, from the response when it names one, else from
	// the request.
	Model string `json:"model,omitempty"`
	// Status is the response's HTTP status.
	Status int `json:"status"`
	// Stream is true for a streamed (server-sent events) response.
	Stream bool `json:"stream,omitempty"`
	// Known is false when the response carried no usage the proxy could
	// read (an error, a stream without its usage chunk, an unknown format,
	// a body past the parser's bound): Tokens are then zero and the
	// request is counted in UsageTotals.Unknown.
	Known bool `json:"known"`
	// Estimated is true when, under a cost or token budget, the
	// response's usage could not be read to its end (the agent cut it
	// short and the rest did not arrive within the proxy's bounds, the
	// connection failed once the request was sent, or a success carried no
	// usage): Tokens and CostUSD are then the request's reserved worst
	// case (its output cap, its input estimated from the body's size),
	// counted as spent, never what the agent chose to receive.
	Estimated bool `json:"estimated,omitempty"`
	// Tokens are the response's tokens by kind.
	Tokens Tokens `json:"tokens"`
	// WebSearches counts the provider's web searches the response paid for,
	// billed per search on top of the tokens: Anthropic's
	// usage.server_tool_use.web_search_requests, the web_search_call items
	// of an OpenAI Responses output.
	WebSearches int64 `json:"web_searches,omitempty"`
	// CostUSD is what the tokens and searches cost by the worker's price
	// table, in US dollars; absent when the table has no price for the model
	// (or there is no table).
	CostUSD *float64 `json:"cost_usd,omitempty"`
	// PartlyUnpriced names the prices the response needed that the table's
	// row for the model lacks ("web_search", "cache_write_1h",
	// "cache_read above 200000 input tokens"), and a processing tier dearer
	// than the standard one the provider served it at ("service_tier
	// priority", "speed fast"): CostUSD is then what the rest cost at the
	// table's rates, a lower bound.
	PartlyUnpriced []string `json:"partly_unpriced,omitempty"`
	// DurationMS is from the request to the response's end, in
	// milliseconds.
	DurationMS int64 `json:"duration_ms"`
}

// UsageTotals sums a run's model usage (its UsageEvents), kept in its
// RunState and on its finished event.
type UsageTotals struct {
	// Requests counts the model requests sent upstream (every request to
	// a host the proxy injects a key for, Known or not; those a budget
	// refused are counted in Refused instead).
	Requests int64 `json:"requests"`
	// Unknown counts the requests whose usage could not be read and was
	// not estimated.
	Unknown int64 `json:"unknown,omitempty"`
	// Estimated counts the responses charged at their reserved worst
	// case (UsageEvent.Estimated); their tokens and cost are in Tokens
	// and CostUSD.
	Estimated int64 `json:"estimated,omitempty"`
	// Tokens sums the tokens by kind.
	Tokens Tokens `json:"tokens"`
	// WebSearches sums the responses' web searches (UsageEvent.WebSearches).
	WebSearches int64 `json:"web_searches,omitempty"`
	// CostUSD sums the priced responses' costs, in US dollars.
	CostUSD float64 `json:"cost_usd"`
	// Unpriced counts Known responses the price table had no price for
	// (their tokens are in Tokens, not in CostUSD).
	Unpriced int64 `json:"unpriced,omitempty"`
	// PartlyUnpriced counts the priced responses with a part the table has
	// no price for (UsageEvent.PartlyUnpriced): CostUSD is then a lower
	// bound.
	PartlyUnpriced int64 `json:"partly_unpriced,omitempty"`
	// Refused counts the requests to a metered host the proxy answered
	// itself: past a budget or a key's rate, a protocol upgrade, or, under
	// a cost or token budget, one whose usage or price it could not know.
	Refused int64 `json:"refused,omitempty"`
}

// Add counts ev into t.
func (t *UsageTotals) Add(ev UsageEvent) {
	t.Requests++
	if ev.Estimated {
		t.Estimated++
	} else if !ev.Known {
		t.Unknown++
		return
	}
	t.Tokens = t.Tokens.Add(ev.Tokens)
	t.WebSearches += ev.WebSearches
	switch {
	case ev.CostUSD == nil:
		t.Unpriced++
	case len(ev.PartlyUnpriced) > 0:
		t.CostUSD += *ev.CostUSD
		t.PartlyUnpriced++
	default:
		t.CostUSD += *ev.CostUSD
	}
}

// BudgetEvent is the body of an EventBudget.
type BudgetEvent struct {
	// RunID is the run.
	RunID string `json:"run_id"`
	// Time is when the request past the budget was refused.
	Time time.Time `json:"time"`
	// Budget is the profile key of the budget reached: "max_cost_usd",
	// "max_output_tokens", "max_model_requests".
	Budget string `json:"budget"`
	// Limit and Spent are in the budget's unit (US dollars, tokens,
	// requests).
	Limit float64 `json:"limit"`
	Spent float64 `json:"spent"`
	// Action is what the worker does: "fail" (the run ends failed with
	// Reason).
	Action string `json:"action"`
	// Reason says which budget and how much was spent.
	Reason string `json:"reason"`
}

// BucketBudgets is the key-value bucket of the budgets runs share: one key
// per group or pool and window (BudgetKey) holding a BudgetSpend, updated
// by compare-and-set (the revision the writer read), so workers adding to
// one budget at once never lose an update; and one key per run or group an
// operator granted more to (GrantKey, also a BudgetSpend). Keys live
// BudgetKeyMaxAge past their last update.
const BucketBudgets = "jetcrew-budgets"

// BudgetKeyMaxAge is the bucket's MaxAge: past the longest window a
// profile may set (MaxBudgetWindow), so a window's key outlives it.
const BudgetKeyMaxAge = 8 * 24 * time.Hour

// MaxBudgetWindow is the longest budget window a profile may set.
const MaxBudgetWindow = 7 * 24 * time.Hour

// Budget scopes: what a shared budget is shared by.
const (
	// BudgetScopeGroup is a group's budget: every run of the group
	// (RunRequest.GroupRef), on any worker; its name is the group's
	// GroupRef.Key, "<pool>.<group>".
	BudgetScopeGroup = "group"
	// BudgetScopePool is a pool's budget: every run of the pool.
	BudgetScopePool = "pool"
	// BudgetScopeRun names a run's own budget in a GrantKey.
	BudgetScopeRun = "run"
)

// BudgetSpend is the value of a BucketBudgets key: what a group or pool
// spent in a window (BudgetKey), or what an operator granted on top of a
// budget (GrantKey).
type BudgetSpend struct {
	// CostUSD is in US dollars.
	CostUSD float64 `json:"cost_usd"`
	// OutputTokens counts output tokens.
	OutputTokens int64 `json:"output_tokens"`
	// Requests counts model requests.
	Requests int64 `json:"requests"`
	// ReservedCostUSD and ReservedOutputTokens are the worst cases of
	// the model requests in flight in the window, held against the budget
	// until each response ends and is added at its real cost (a budget
	// key's value only; a worker that dies mid-request leaves its
	// reservation until the window ends).
	ReservedCostUSD      float64 `json:"reserved_cost_usd,omitempty"`
	ReservedOutputTokens int64   `json:"reserved_output_tokens,omitempty"`
}

// Add returns b plus d, field by field.
func (b BudgetSpend) Add(d BudgetSpend) BudgetSpend {
	return BudgetSpend{CostUSD: b.CostUSD + d.CostUSD, OutputTokens: b.OutputTokens + d.OutputTokens, Requests: b.Requests + d.Requests,
		ReservedCostUSD: b.ReservedCostUSD + d.ReservedCostUSD, ReservedOutputTokens: b.ReservedOutputTokens + d.ReservedOutputTokens}
}

// BudgetKey returns the key of scope's budget named name (a group's
// GroupRef.Key, or a pool) for the window of the given length that holds t: windows are
// aligned to the Unix epoch, so every worker names the same key;
// "<scope>.<name>.<window start, Unix seconds>-<window seconds>".
func BudgetKey(scope, name string, window time.Duration, t time.Time) string {
	w := int64(window / time.Second)
	if w <= 0 {
		w = 1
	}
	start := t.Unix() / w * w
	return scope + "." + name + "." + strconv.FormatInt(start, 10) + "-" + strconv.FormatInt(w, 10)
}

// GrantKey returns the key of what an operator granted on top of scope's
// budget (BudgetScopeRun with a run id, BudgetScopeGroup with a group's
// GroupRef.Key): "grant.<scope>.<name>" ("grant.group.<pool>.<group>").
func GrantKey(scope, name string) string {
	return "grant." + scope + "." + name
}
