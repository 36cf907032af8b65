package usage

import (
	"bytes"
	"encoding/json"

	"github.com/jetcrew/jetcrew/messages"
)

// inputDetails is the breakdown of OpenAI's input tokens (Chat's
// prompt_tokens_details, Responses' input_tokens_details): the tokens read
// from the prompt cache and those written to it, both inside the input
// count (the openai-go SDK's CompletionUsagePromptTokensDetails and
// ResponseUsageInputTokensDetails).
type inputDetails struct {
	CachedTokens     *int64 `json:"cached_tokens"`
	CacheWriteTokens *int64 `json:"cache_write_tokens"`
}

// chatUsage is OpenAI Chat Completions' usage object.
type chatUsage struct {
	PromptTokens        *int64        `json:"prompt_tokens"`
	CompletionTokens    *int64        `json:"completion_tokens"`
	PromptTokensDetails *inputDetails `json:"prompt_tokens_details"`
}

// tokens returns u as Tokens: the cached and cache-written prompt tokens
// are CacheRead and CacheWrite, not Input; completion_tokens includes the
// reasoning tokens.
func (u *chatUsage) tokens() messages.Tokens {
	return openAITokens(u.PromptTokens, u.PromptTokensDetails, u.CompletionTokens)
}

// openAITokens returns OpenAI's counts as Tokens: of the input (prompt)
// tokens, the cached ones are CacheRead, those written to the cache
// CacheWrite, and the rest Input, so the kinds add up to the input count.
func openAITokens(input *int64, d *inputDetails, output *int64) messages.Tokens {
	in := count(input)
	var cached, written int64
	if d != nil {
		cached = min(count(d.CachedTokens), in)
		written = min(count(d.CacheWriteTokens), in-cached)
	}
	return messages.Tokens{Input: in - cached - written, Output: count(output), CacheRead: cached, CacheWrite: written}
}

// chatResponse is the part of a chat completion, or of a stream's chunk,
// that says the model, usage and service tier.
type chatResponse struct {
	Model       string     `json:"model"`
	Usage       *chatUsage `json:"usage"`
	ServiceTier string     `json:"service_tier"`
}

// read takes r's model, usage (the latest seen) and tier into t.
func (r *chatResponse) read(t *tally) {
	if r.Model != "" {
		t.model = r.Model
	}
	if tier := dearTier("service_tier", r.ServiceTier); tier != "" {
		t.tier = tier
	}
	if r.Usage != nil {
		t.tokens, t.known = r.Usage.tokens(), true
	}
}

// chatBody reads a chat completion response body.
func chatBody(t *tally, data []byte) {
	var r chatResponse
	if json.Unmarshal(data, &r) == nil {
		r.read(t)
	}
}

// chatEvent reads a chat completion stream's chunk: each names the model;
// the last before [DONE] carries usage when the request asked for it (the
// others have "usage": null). The latest usage seen is kept.
func chatEvent(t *tally, data []byte) {
	if bytes.Equal(data, []byte("[DONE]")) || (t.model != "" && !mentions(data, `"usage"`)) {
		return
	}
	chatBody(t, data)
}

// responsesUsage is OpenAI Responses' usage object.
type responsesUsage struct {
	InputTokens        *int64        `json:"input_tokens"`
	OutputTokens       *int64        `json:"output_tokens"`
	InputTokensDetails *inputDetails `json:"input_tokens_details"`
}

// tokens returns u as Tokens: the cached and cache-written input tokens
// are CacheRead and CacheWrite, not Input; output_tokens includes the
// reasoning tokens.
func (u *responsesUsage) tokens() messages.Tokens {
	return openAITokens(u.InputTokens, u.InputTokensDetails, u.OutputTokens)
}

// responsesResponse is the part of a Response object that says the model,
// usage (null until the response is done) and output items, among which
// each web_search_call is one web search the tool bills.
type responsesResponse struct {
	Model       string          `json:"model"`
	Usage       *responsesUsage `json:"usage"`
	ServiceTier string          `json:"service_tier"`
	Output      []struct {
		Type string `json:"type"`
	} `json:"output"`
}

// read takes r's model, usage, tier and web searches into t.
func (r *responsesResponse) read(t *tally) {
	if r.Model != "" {
		t.model = r.Model
	}
	if r.Usage == nil {
		return
	}
	t.tokens, t.known = r.Usage.tokens(), true
	t.tier = dearTier("service_tier", r.ServiceTier)
	t.webSearches = 0
	for _, item := range r.Output {
		if item.Type == "web_search_call" {
			t.webSearches++
		}
	}
}

// responsesBody reads a Responses response body (a Response object).
func responsesBody(t *tally, data []byte) {
	var r responsesResponse
	if json.Unmarshal(data, &r) == nil {
		r.read(t)
	}
}

// responsesEvent reads a Responses stream event. The events that carry
// the whole Response (response.created, response.in_progress, and the
// final response.completed, response.incomplete or response.failed) name
// the model; the final one carries usage and the whole output, whose
// web_search_call items are counted then (each once: the
// response.output_item events that announced them are not counted).
func responsesEvent(t *tally, data []byte) {
	if !mentions(data, `"response"`) || !mentions(data, `"usage"`) {
		return
	}
	var e struct {
		Response *responsesResponse `json:"response"`
	}
	if json.Unmarshal(data, &e) == nil && e.Response != nil {
		e.Response.read(t)
	}
}
