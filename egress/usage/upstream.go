package usage

import (
	"encoding/json"
	"net/http"

	"github.com/jetcrew/jetcrew/messages"
)

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
		}{"error", detail{"api_error", msg}}
	case messages.FormatOpenAIChat, messages.FormatOpenAIResponses:
		v = struct {
			Error openaiDetail `json:"error"`
		}{openaiDetail{Message: msg, Type: "server_error"}}
	case messages.FormatGemini, messages.FormatGeminiCodeAssist:
		v = struct {
			Error googleDetail `json:"error"`
		}{googleDetail{http.StatusBadGateway, msg, "UNAVAILABLE"}}
	default:
		return http.StatusBadGateway, "text/plain; charset=utf-8", []byte(msg + "\n")
	}
	b, err := json.Marshal(v)
	if err != nil { // structs of strings always marshal
		panic(err)
	}
	return http.StatusBadGateway, "application/json", b
}
