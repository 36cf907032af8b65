package usage

import (
	"encoding/json"
	"net/http"

	"github.com/jetcrew/jetcrew/messages"
)

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
		}{"error", detail{"permission_error", msg}}
	case messages.FormatOpenAIChat, messages.FormatOpenAIResponses:
		v = struct {
			Error openaiDetail `json:"error"`
		}{openaiDetail{Message: msg, Type: "invalid_request_error"}}
	case messages.FormatGemini, messages.FormatGeminiCodeAssist:
		v = struct {
			Error googleDetail `json:"error"`
		}{googleDetail{http.StatusForbidden, msg, "PERMISSION_DENIED"}}
	default:
		return http.StatusForbidden, "text/plain; charset=utf-8", []byte(msg)
	}
	b, err := json.Marshal(v)
	if err != nil { // structs of strings always marshal
		panic(err)
	}
	return http.StatusForbidden, "application/json", b
}
