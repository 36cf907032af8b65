package usage_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

func TestQuotaError(t *testing.T) {
	t.Parallel()
	const msg = `jetcrew: budget reached: max_cost_usd 5 (spent 5.01 USD) "quoted" <tag>`
	for _, tc := range []struct {
		format string
		ct     string
		want   string
	}{
		{messages.FormatAnthropic, "application/json",
			`{"type":"error","error":{"type":"rate_limit_error","message":` + quote(msg) + `}}`},
		{messages.FormatOpenAIChat, "application/json",
			`{"error":{"message":` + quote(msg) + `,"type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`},
		{messages.FormatOpenAIResponses, "application/json",
			`{"error":{"message":` + quote(msg) + `,"type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`},
		{messages.FormatGemini, "application/json",
			`{"error":{"code":429,"message":` + quote(msg) + `,"status":"RESOURCE_EXHAUSTED"}}`},
		{messages.FormatGeminiCodeAssist, "application/json",
			`{"error":{"code":429,"message":` + quote(msg) + `,"status":"RESOURCE_EXHAUSTED"}}`},
	} {
		status, ct, body := usage.QuotaError(tc.format, msg)
		require.Equal(t, 429, status, tc.format)
		require.Equal(t, tc.ct, ct, tc.format)
		require.Equal(t, tc.want, string(body), tc.format) // the documented key order, exactly
	}
	status, ct, body := usage.QuotaError("", msg)
	require.Equal(t, 429, status)
	require.Equal(t, "text/plain; charset=utf-8", ct)
	require.Equal(t, msg, string(body))
}

// quote returns s as a JSON string.
func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// PermissionError and RateLimitError answer in each provider's own shape,
// the keys in the documented order; Code Assist in Google's.
func TestPermissionAndRateLimitErrors(t *testing.T) {
	t.Parallel()
	const msg = `jetcrew: refused: "quoted" <tag>`
	google := func(code int, status string) string {
		return `{"error":{"code":` + map[int]string{403: "403", 429: "429"}[code] + `,"message":` + quote(msg) + `,"status":"` + status + `"}}`
	}
	for _, tc := range []struct {
		name   string
		answer func(format, msg string) (int, string, []byte)
		status int
		want   map[string]string
	}{
		{"permission", usage.PermissionError, 403, map[string]string{
			messages.FormatAnthropic:        `{"type":"error","error":{"type":"permission_error","message":` + quote(msg) + `}}`,
			messages.FormatOpenAIChat:       `{"error":{"message":` + quote(msg) + `,"type":"invalid_request_error","param":null,"code":null}}`,
			messages.FormatOpenAIResponses:  `{"error":{"message":` + quote(msg) + `,"type":"invalid_request_error","param":null,"code":null}}`,
			messages.FormatGemini:           google(403, "PERMISSION_DENIED"),
			messages.FormatGeminiCodeAssist: google(403, "PERMISSION_DENIED"),
		}},
		{"rate limit", usage.RateLimitError, 429, map[string]string{
			messages.FormatAnthropic:        `{"type":"error","error":{"type":"rate_limit_error","message":` + quote(msg) + `}}`,
			messages.FormatOpenAIChat:       `{"error":{"message":` + quote(msg) + `,"type":"requests","param":null,"code":"rate_limit_exceeded"}}`,
			messages.FormatOpenAIResponses:  `{"error":{"message":` + quote(msg) + `,"type":"requests","param":null,"code":"rate_limit_exceeded"}}`,
			messages.FormatGemini:           google(429, "RESOURCE_EXHAUSTED"),
			messages.FormatGeminiCodeAssist: google(429, "RESOURCE_EXHAUSTED"),
		}},
	} {
		for format, want := range tc.want {
			status, ct, body := tc.answer(format, msg)
			require.Equal(t, tc.status, status, "%s %s", tc.name, format)
			require.Equal(t, "application/json", ct, "%s %s", tc.name, format)
			require.Equal(t, want, string(body), "%s %s", tc.name, format)
		}
		status, ct, body := tc.answer("", msg)
		require.Equal(t, tc.status, status, tc.name)
		require.Equal(t, "text/plain; charset=utf-8", ct, tc.name)
		require.Equal(t, msg, string(body), tc.name)
	}
}
