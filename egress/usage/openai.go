package usage

import (
	"bytes"
	"encoding/json"

	"github.com/jetcrew/jetcrew/messages"
)

// chatUsage is OpenAI Chat Completions' usage object.
type chatUsage struct {
	PromptTokens        *int64 `json:"prompt_tokens"`
	CompletionTokens    *int64 `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// tokens returns u as Tokens: the cached prompt tokens are CacheRead and
// not Input; completion_tokens includes the reasoning tokens.
func (u *chatUsage) tokens() messages.Tokens {
	var cached *int64
	if d := u.PromptTokensDetails; d != nil {
		cached = d.CachedTokens
	}
	return openAITokens(u.PromptTokens, cached, u.CompletionTokens)
}

// openAITokens returns OpenAI's counts as Tokens: of the input (prompt)
// tokens, the cached ones are CacheRead and the rest Input.
func openAITokens(input, cached, output *int64) messages.Tokens {
	in, c := count(input), count(cached)
	return messages.Tokens{Input: minus(in, c), Output: count(output), CacheRead: min(c, in)}
}

// chatResponse is the part of a chat completion, or of a stream's chunk,
// that says the model and usage.
type chatResponse struct {
	Model string     `json:"model"`
	Usage *chatUsage `json:"usage"`
}

// read takes r's model and usage (the latest seen) into t.
func (r *chatResponse) read(t *tally) {
	if r.Model != "" {
		t.model = r.Model
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
	InputTokens        *int64 `json:"input_tokens"`
	OutputTokens       *int64 `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens *int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

// tokens returns u as Tokens: the cached input tokens are CacheRead and not
// Input; output_tokens includes the reasoning tokens.
func (u *responsesUsage) tokens() messages.Tokens {
	var cached *int64
	if d := u.InputTokensDetails; d != nil {
		cached = d.CachedTokens
	}
	return openAITokens(u.InputTokens, cached, u.OutputTokens)
}

// responsesResponse is the part of a Response object that says the model
// and usage (null until the response is done).
type responsesResponse struct {
	Model string          `json:"model"`
	Usage *responsesUsage `json:"usage"`
}

// read takes r's model and usage into t.
func (r *responsesResponse) read(t *tally) {
	if r.Model != "" {
		t.model = r.Model
	}
	if r.Usage != nil {
		t.tokens, t.known = r.Usage.tokens(), true
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
// the model; the final one carries usage.
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
