package usage

import (
	"encoding/json"
	"net/http"

	"github.com/jetcrew/jetcrew/messages"
)

// errorKind is one kind of answer the proxy gives in the providers' own
// error shapes (QuotaError, PermissionError, RateLimitError,
// UpstreamError): its HTTP status and each provider's name for it.
type errorKind struct {
	// status is the HTTP status of every format's answer.
	status int
	// anthropic is Anthropic's error.type.
	anthropic string
	// openai and openaiCode are OpenAI's error.type and error.code ("":
	// null).
	openai, openaiCode string
	// google is Google's error.status (Gemini and Code Assist).
	google string
	// text follows msg in the answer to any other format, as text/plain.
	text string
}

// answer returns k's answer to a request of format with msg as its
// message: the HTTP status, the Content-Type and the body, whose keys are
// in each provider's documented order.
func (k errorKind) answer(format, msg string) (status int, contentType string, body []byte) {
	type detail struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	type openaiDetail struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
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
		}{"error", detail{k.anthropic, msg}}
	case messages.FormatOpenAIChat, messages.FormatOpenAIResponses:
		d := openaiDetail{Message: msg, Type: k.openai}
		if k.openaiCode != "" {
			d.Code = &k.openaiCode
		}
		v = struct {
			Error openaiDetail `json:"error"`
		}{d}
	case messages.FormatGemini, messages.FormatGeminiCodeAssist:
		v = struct {
			Error googleDetail `json:"error"`
		}{googleDetail{k.status, msg, k.google}}
	default:
		return k.status, "text/plain; charset=utf-8", []byte(msg + k.text)
	}
	b, err := json.Marshal(v)
	if err != nil { // structs of strings always marshal
		panic(err)
	}
	return k.status, "application/json", b
}

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
	return errorKind{status: http.StatusTooManyRequests, anthropic: "rate_limit_error",
		openai: "insufficient_quota", openaiCode: "insufficient_quota", google: "RESOURCE_EXHAUSTED"}.answer(format, msg)
}

// PermissionError returns the response the proxy sends in place of a
// request it does not let reach the provider although no budget is
// reached (a path whose usage it cannot read, a model it has no price
// for): the provider's own error shape for a request that is not
// permitted, HTTP 403, which the providers' SDKs do not retry (they retry
// 408, 409, 429 and 5xx). It returns the status, the Content-Type and the
// body:
//
//   - Anthropic: {"type":"error","error":{"type":"permission_error","message":msg}}
//     (Anthropic's documented 403 type);
//   - OpenAI Chat and Responses: {"error":{"message":msg,"type":"invalid_request_error","param":null,"code":null}}
//     (the shape of every OpenAI error);
//   - Gemini and Code Assist: {"error":{"code":403,"message":msg,"status":"PERMISSION_DENIED"}}
//     (Google's API error shape);
//   - any other format: msg as text/plain.
func PermissionError(format, msg string) (status int, contentType string, body []byte) {
	return errorKind{status: http.StatusForbidden, anthropic: "permission_error",
		openai: "invalid_request_error", google: "PERMISSION_DENIED"}.answer(format, msg)
}

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
	return errorKind{status: http.StatusTooManyRequests, anthropic: "rate_limit_error",
		openai: "requests", openaiCode: "rate_limit_exceeded", google: "RESOURCE_EXHAUSTED"}.answer(format, msg)
}

// UpstreamError returns the proxy's answer to a model request it could not
// take to its host. The body has the provider's own server-error shape, so
// the agent's client shows msg as the provider's message and fails the
// request instead of reading a closed connection as an empty answer. It
// returns the HTTP status (always 502 Bad Gateway), the Content-Type and
// the body:
//
//   - Anthropic: {"type":"error","error":{"type":"api_error","message":msg}}
//     (the documented error shape; api_error is its type for a server
//     error);
//   - OpenAI Chat and Responses: {"error":{"message":msg,"type":"server_error","param":null,"code":null}}
//     (OpenAI's shape for a 5xx);
//   - Gemini and Code Assist: {"error":{"code":502,"message":msg,"status":"UNAVAILABLE"}}
//     (Google's API error shape);
//   - any other format: msg and a newline as text/plain.
//
// The providers' SDKs retry a 5xx (twice by default) unless the response
// has "x-should-retry: false"; a caller that knows a retry meets the same
// failure sets it.
func UpstreamError(format, msg string) (status int, contentType string, body []byte) {
	return errorKind{status: http.StatusBadGateway, anthropic: "api_error",
		openai: "server_error", google: "UNAVAILABLE", text: "\n"}.answer(format, msg)
}
