package usage

import (
	"encoding/json"
	"net/http"

	"github.com/jetcrew/jetcrew/messages"
)

// QuotaError returns the response the proxy sends in place of a model
// request of format (Detect's) when a budget is reached: the provider's own
// error shape for a rate or quota limit, so the agent's client shows msg as
// the provider's message. It returns the HTTP status (always 429), the
// Content-Type and the body:
//
//   - Anthropic: {"type":"error","error":{"type":"rate_limit_error","message":msg}}
//     (Anthropic's documented error shape and 429 type);
//   - OpenAI Chat and Responses: {"error":{"message":msg,"type":"insufficient_quota","param":null,"code":"insufficient_quota"}}
//     (OpenAI's 429 for an exhausted quota, which clients such as the Codex
//     CLI treat as final rather than retrying);
//   - Gemini and Code Assist: {"error":{"code":429,"message":msg,"status":"RESOURCE_EXHAUSTED"}}
//     (Google's API error shape);
//   - any other format: msg as text/plain.
//
// Clients built on Anthropic's and OpenAI's SDKs retry a 429 (twice by
// default, with backoff) unless the response has the header
// "x-should-retry: false"; a caller that does not want the refused
// request repeated sets it.
func QuotaError(format, msg string) (status int, contentType string, body []byte) {
	type detail struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	type openaiDetail struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	}
	type googleDetail struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Status  string `json:"status"`
	}
	var v any
	switch format {
	case messages.FormatAnthropic:
		v = struct {
			Type  string `json:"type"`
			Error detail `json:"error"`
		}{"error", detail{"rate_limit_error", msg}}
	case messages.FormatOpenAIChat, messages.FormatOpenAIResponses:
		v = struct {
			Error openaiDetail `json:"error"`
		}{openaiDetail{Message: msg, Type: "insufficient_quota", Code: "insufficient_quota"}}
	case messages.FormatGemini, messages.FormatGeminiCodeAssist:
		v = struct {
			Error googleDetail `json:"error"`
		}{googleDetail{http.StatusTooManyRequests, msg, "RESOURCE_EXHAUSTED"}}
	default:
		return http.StatusTooManyRequests, "text/plain; charset=utf-8", []byte(msg)
	}
	b, err := json.Marshal(v)
	if err != nil { // structs of strings always marshal
		panic(err)
	}
	return http.StatusTooManyRequests, "application/json", b
}
