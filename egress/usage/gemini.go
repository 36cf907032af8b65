package usage

import (
	"bytes"
	"encoding/json"

	"github.com/jetcrew/jetcrew/messages"
)

// geminiUsage is Gemini's usageMetadata.
type geminiUsage struct {
	PromptTokenCount        *int64 `json:"promptTokenCount"`
	CachedContentTokenCount *int64 `json:"cachedContentTokenCount"`
	CandidatesTokenCount    *int64 `json:"candidatesTokenCount"`
	ThoughtsTokenCount      *int64 `json:"thoughtsTokenCount"`
}

// tokens returns u as Tokens: cachedContentTokenCount is part of
// promptTokenCount and is counted as CacheRead, not Input; Output is the
// candidates' tokens plus the thinking tokens, which Gemini reports apart.
func (u *geminiUsage) tokens() messages.Tokens {
	prompt, cached := count(u.PromptTokenCount), count(u.CachedContentTokenCount)
	return messages.Tokens{Input: minus(prompt, cached), CacheRead: min(cached, prompt),
		Output: count(u.CandidatesTokenCount) + count(u.ThoughtsTokenCount)}
}

// geminiResponse is the part of a GenerateContentResponse that says the
// model (modelVersion) and usage.
type geminiResponse struct {
	ModelVersion  string       `json:"modelVersion"`
	UsageMetadata *geminiUsage `json:"usageMetadata"`
}

// read takes r's model and usage (the latest seen) into t.
func (r *geminiResponse) read(t *tally) {
	if r.ModelVersion != "" {
		t.model = r.ModelVersion
	}
	if r.UsageMetadata != nil {
		t.tokens, t.known = r.UsageMetadata.tokens(), true
	}
}

// geminiBody reads a generateContent response body, or a
// streamGenerateContent body without alt=sse: a JSON array of responses,
// each with the usage so far, of which the last counts.
func geminiBody(t *tally, data []byte) {
	data = bytes.TrimLeft(data, " \t\r\n")
	if len(data) > 0 && data[0] == '[' {
		var rs []geminiResponse
		if json.Unmarshal(data, &rs) != nil {
			return
		}
		for i := range rs {
			rs[i].read(t)
		}
		return
	}
	var r geminiResponse
	if json.Unmarshal(data, &r) == nil {
		r.read(t)
	}
}

// geminiEvent reads a streamGenerateContent?alt=sse chunk: a
// GenerateContentResponse whose usageMetadata is the usage so far.
func geminiEvent(t *tally, data []byte) {
	if t.model != "" && !mentions(data, `"usageMetadata"`) {
		return
	}
	var r geminiResponse
	if json.Unmarshal(data, &r) == nil {
		r.read(t)
	}
}
