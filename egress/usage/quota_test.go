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
