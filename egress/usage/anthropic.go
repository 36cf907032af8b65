package usage

import (
	"encoding/json"

	"github.com/jetcrew/jetcrew/messages"
)

// anthropicUsage is Anthropic Messages' usage object. Counts are pointers:
// a stream's message_delta omits (or sends null for) the counts it does
// not update.
type anthropicUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	// CacheCreation splits the cache writes by lifetime: 5 minutes (1.25
	// times the input price) or 1 hour (twice it).
	CacheCreation *struct {
		Ephemeral1hInputTokens *int64 `json:"ephemeral_1h_input_tokens"`
	} `json:"cache_creation"`
	// ServerToolUse counts the server tools' requests: web searches are
	// billed per request, web fetches are not.
	ServerToolUse *struct {
		WebSearchRequests *int64 `json:"web_search_requests"`
	} `json:"server_tool_use"`
	// ServiceTier ("standard", "priority", "batch") and Speed ("standard",
	// "fast") say how the request was served, and so at which rates.
	ServiceTier string `json:"service_tier"`
	Speed       string `json:"speed"`
}

// tier returns the dearer tier u says the message was served at, "" for
// the standard one.
func (u *anthropicUsage) tier() string {
	if t := dearTier("speed", u.Speed); t != "" {
		return t
	}
	return dearTier("service_tier", u.ServiceTier)
}

// cacheWrite1h returns u's one-hour cache writes, nil when absent.
func (u *anthropicUsage) cacheWrite1h() *int64 {
	if u.CacheCreation == nil {
		return nil
	}
	return u.CacheCreation.Ephemeral1hInputTokens
}

// webSearches returns u's web search requests, nil when absent.
func (u *anthropicUsage) webSearches() *int64 {
	if u.ServerToolUse == nil {
		return nil
	}
	return u.ServerToolUse.WebSearchRequests
}

// tokens returns u as Tokens (Anthropic's input_tokens already excludes
// the cache kinds).
func (u *anthropicUsage) tokens() messages.Tokens {
	return messages.Tokens{Input: count(u.InputTokens), Output: count(u.OutputTokens),
		CacheRead: count(u.CacheReadInputTokens), CacheWrite: count(u.CacheCreationInputTokens),
		CacheWrite1h: count(u.cacheWrite1h())}
}

// anthropicMessage is the part of a Message (a JSON response, or
// message_start's message) that says the model and usage.
type anthropicMessage struct {
	Model string          `json:"model"`
	Usage *anthropicUsage `json:"usage"`
}

// anthropicBody reads a Messages response body.
func anthropicBody(t *tally, data []byte) {
	var m anthropicMessage
	if json.Unmarshal(data, &m) != nil {
		return
	}
	if m.Model != "" {
		t.model = m.Model
	}
	if m.Usage != nil {
		t.tokens, t.known = m.Usage.tokens(), true
		t.webSearches = count(m.Usage.webSearches())
		t.tier = m.Usage.tier()
	}
}

// anthropicEvent reads a Messages stream event: message_start's
// message.usage and message.model, and message_delta's usage, whose counts
// are totals for the whole message so far (the server tools' requests
// included). Each count keeps its latest non-zero value: a delta that
// omits a count, or sends it as 0 or null, leaves the one message_start
// gave, and a delta that repeats a count replaces it, never adds to it.
// (The Anthropic Go SDK's Message.Accumulate overwrites with any count
// present, 0 included; the two differ only on a delta that sends 0 after a
// non-zero count, which would not be a cumulative count.)
func anthropicEvent(t *tally, data []byte) {
	if !mentions(data, `"usage"`) {
		return
	}
	var e struct {
		Type    string            `json:"type"`
		Message *anthropicMessage `json:"message"`
		Usage   *anthropicUsage   `json:"usage"`
	}
	if json.Unmarshal(data, &e) != nil {
		return
	}
	var u *anthropicUsage
	switch e.Type {
	case "message_start":
		if e.Message == nil {
			return
		}
		if e.Message.Model != "" {
			t.model = e.Message.Model
		}
		u = e.Message.Usage
	case "message_delta":
		u = e.Usage
	}
	if u == nil {
		return
	}
	t.known = true
	latest(&t.tokens.Input, u.InputTokens)
	latest(&t.tokens.Output, u.OutputTokens)
	latest(&t.tokens.CacheRead, u.CacheReadInputTokens)
	latest(&t.tokens.CacheWrite, u.CacheCreationInputTokens)
	latest(&t.tokens.CacheWrite1h, u.cacheWrite1h())
	latest(&t.webSearches, u.webSearches())
	if tier := u.tier(); tier != "" {
		t.tier = tier
	}
}

// latest sets *dst to *n when n is present and positive.
func latest(dst *int64, n *int64) {
	if v := count(n); v > 0 {
		*dst = v
	}
}
