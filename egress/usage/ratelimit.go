package usage

import (
	"encoding/json"
	"net/http"

	"github.com/jetcrew/jetcrew/messages"
)

// RateLimitError returns the response the proxy sends in place of a model
// request its key's rate cannot take yet (profile key egress_rate): the
// provider's own error for a rate limit, HTTP 429, which the providers'
// SDKs retry after the response's retry-after (the caller sets it). It
// returns the status, the Content-Type and the body:
//
//   - Anthropic: {"type":"error","error":{"type":"rate_limit_error","message":msg}};
//   - OpenAI Chat and Responses: {"error":{"message":msg,"type":"requests","param":null,"code":"rate_limit_exceeded"}}
//     (OpenAI's rate limit error, which clients retry; not
//     insufficient_quota, which they take as final);
//   - Gemini and Code Assist: {"error":{"code":429,"message":msg,"status":"RESOURCE_EXHAUSTED"}};
//   - any other format: msg as text/plain.
func RateLimitError(format, msg string) (status int, contentType string, body []byte) {
	if format != messages.FormatOpenAIChat && format != messages.FormatOpenAIResponses {
		return QuotaError(format, msg)
	}
	type openaiDetail struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	}
	b, err := json.Marshal(struct {
		Error openaiDetail `json:"error"`
	}{openaiDetail{Message: msg, Type: "requests", Code: "rate_limit_exceeded"}})
	if err != nil { // structs of strings always marshal
		panic(err)
	}
	return http.StatusTooManyRequests, "application/json", b
}
