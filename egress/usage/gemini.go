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
	ToolUsePromptTokenCount *int64 `json:"toolUsePromptTokenCount"`
	CandidatesTokenCount    *int64 `json:"candidatesTokenCount"`
	ThoughtsTokenCount      *int64 `json:"thoughtsTokenCount"`
}

// tokens returns u as Tokens: cachedContentTokenCount is part of
// promptTokenCount and is counted as CacheRead, not Input;
// toolUsePromptTokenCount (the tools' results the model read, such as
// Google Search grounding's) is input on top of promptTokenCount; Output
// is the candidates' tokens plus the thinking tokens, which Gemini reports
// apart (totalTokenCount is the sum of the four counts).
func (u *geminiUsage) tokens() messages.Tokens {
	prompt, cached := count(u.PromptTokenCount), count(u.CachedContentTokenCount)
	return messages.Tokens{Input: minus(prompt, cached) + count(u.ToolUsePromptTokenCount), CacheRead: min(cached, prompt),
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
	eachJSON(data, func(r *geminiResponse) { r.read(t) })
}

// geminiEvent reads a streamGenerateContent?alt=sse chunk: a
// GenerateContentResponse whose usageMetadata is the usage so far (an
// early chunk's may lack the candidates' and thoughts' counts: the last
// chunk's is the total, and replaces the ones before).
func geminiEvent(t *tally, data []byte) {
	if t.model != "" && !mentions(data, `"usageMetadata"`) {
		return
	}
	var r geminiResponse
	if json.Unmarshal(data, &r) == nil {
		r.read(t)
	}
}

// codeAssistResponse is a Code Assist answer (FormatGeminiCodeAssist): a
// GenerateContentResponse under "response" (Gemini CLI's
// CaGenerateContentResponse).
type codeAssistResponse struct {
	Response *geminiResponse `json:"response"`
}

// read takes the wrapped response's model and usage into t.
func (r *codeAssistResponse) read(t *tally) {
	if r.Response != nil {
		r.Response.read(t)
	}
}

// codeAssistBody reads a Code Assist generateContent body, or a
// streamGenerateContent one without alt=sse (a JSON array).
func codeAssistBody(t *tally, data []byte) {
	eachJSON(data, func(r *codeAssistResponse) { r.read(t) })
}

// codeAssistEvent reads a Code Assist streamGenerateContent?alt=sse chunk,
// as geminiEvent reads Gemini's.
func codeAssistEvent(t *tally, data []byte) {
	if t.model != "" && !mentions(data, `"usageMetadata"`) {
		return
	}
	var r codeAssistResponse
	if json.Unmarshal(data, &r) == nil {
		r.read(t)
	}
}

// eachJSON decodes data, one JSON object or an array of them, and calls
// read with each object in order; data that does not decode is ignored
// whole.
func eachJSON[T any](data []byte, read func(*T)) {
	data = bytes.TrimLeft(data, " \t\r\n")
	if len(data) > 0 && data[0] == '[' {
		var rs []T
		if json.Unmarshal(data, &rs) != nil {
			return
		}
		for i := range rs {
			read(&rs[i])
		}
		return
	}
	var r T
	if json.Unmarshal(data, &r) == nil {
		read(&r)
	}
}
