package usage_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// UpstreamError answers a model request the proxy could not take to its
// host in the provider's own 5xx shape, status 502, the message escaped as
// JSON, the keys in the documented order.
func TestUpstreamError(t *testing.T) {
	t.Parallel()
	const msg = `jetcrew egress: upstream certificate not trusted: x509: "quoted" <tag>`
	for _, tc := range []struct {
		format string
		want   string
	}{
		{messages.FormatAnthropic,
			`{"type":"error","error":{"type":"api_error","message":` + quote(msg) + `}}`},
		{messages.FormatOpenAIChat,
			`{"error":{"message":` + quote(msg) + `,"type":"server_error","param":null,"code":null}}`},
		{messages.FormatOpenAIResponses,
			`{"error":{"message":` + quote(msg) + `,"type":"server_error","param":null,"code":null}}`},
		{messages.FormatGemini,
			`{"error":{"code":502,"message":` + quote(msg) + `,"status":"UNAVAILABLE"}}`},
		{messages.FormatGeminiCodeAssist,
			`{"error":{"code":502,"message":` + quote(msg) + `,"status":"UNAVAILABLE"}}`},
	} {
		status, ct, body := usage.UpstreamError(tc.format, msg)
		require.Equal(t, 502, status, tc.format)
		require.Equal(t, "application/json", ct, tc.format)
		require.Equal(t, tc.want, string(body), tc.format)
	}
	status, ct, body := usage.UpstreamError("", msg)
	require.Equal(t, 502, status)
	require.Equal(t, "text/plain; charset=utf-8", ct)
	require.Equal(t, msg+"\n", string(body))
}
