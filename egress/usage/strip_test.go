package usage_test

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// chunkedReader gives r's bytes n at a time.
type chunkedReader struct {
	r io.Reader
	n int
}

func (c *chunkedReader) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), c.n)]) }

// StripUsage takes out exactly the usage chunk, however the stream is
// split: the rest is the provider's stream byte for byte, CRLF lines,
// comments and a final event without its blank line included.
func TestStripUsage(t *testing.T) {
	t.Parallel()
	withUsage := fixture(t, "openai-chat-stream-usage.sse")
	var chunk []byte
	for ev := range bytes.SplitAfterSeq(withUsage, []byte("\n\n")) {
		if bytes.Contains(ev, []byte(`"choices":[],"usage":{`)) {
			chunk = ev
		}
	}
	require.NotNil(t, chunk)
	long := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 70<<10) + "\"}}],\"usage\":null}\n\n"
	for _, tc := range []struct{ name, in, want string }{
		{"recorded", string(withUsage), string(bytes.Replace(withUsage, chunk, nil, 1))},
		{"crlf", "data: {\"choices\":[{}]}\r\n\r\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\r\n\r\ndata: [DONE]\r\n\r\n",
			"data: {\"choices\":[{}]}\r\n\r\ndata: [DONE]\r\n\r\n"},
		{"comment and event name", ": keep-alive\n\nevent: x\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n", ": keep-alive\n\n"},
		{"usage beside choices stays", "data: {\"choices\":[{\"delta\":{}}],\"usage\":{\"prompt_tokens\":1}}\n\n",
			"data: {\"choices\":[{\"delta\":{}}],\"usage\":{\"prompt_tokens\":1}}\n\n"},
		{"null usage stays", "data: {\"choices\":[],\"usage\":null}\n\n", "data: {\"choices\":[],\"usage\":null}\n\n"},
		{"last event unended", "data: {\"choices\":[{}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}", "data: {\"choices\":[{}]}\n\n"},
		{"long event passes", long + string(chunk) + "data: [DONE]\n\n", long + "data: [DONE]\n\n"},
		{"extra blank lines", "\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n\n", "\n\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, n := range []int{1, 2, 7, 100, 1 << 20} {
				got, err := io.ReadAll(usage.StripUsage(io.NopCloser(&chunkedReader{r: strings.NewReader(tc.in), n: n})))
				require.NoError(t, err)
				require.Equal(t, tc.want, string(got), "read %d bytes at a time", n)
			}
		})
	}
}

// A read error is given after the bytes before it, as the body gave it.
func TestStripUsageError(t *testing.T) {
	t.Parallel()
	r := io.MultiReader(strings.NewReader("data: {\"choices\":[{}]}\n\n"), iotest.ErrReader(io.ErrUnexpectedEOF))
	got, err := io.ReadAll(usage.StripUsage(io.NopCloser(r)))
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.Equal(t, "data: {\"choices\":[{}]}\n\n", string(got))
}

// ReadRequest reads the bounds of each format's request by its exact keys;
// IncludeUsage rewrites a chat request to ask for usage and keeps the rest.
func TestReadRequestBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, format, path, body string
		req                      usage.Request
		b                        usage.Bounds
	}{
		{"anthropic", messages.FormatAnthropic, "/v1/messages", `{"model":"claude-x","max_tokens":512,"stream":true}`,
			usage.Request{Model: "claude-x", Stream: true}, usage.Bounds{MaxOutput: 512}},
		{"chat", messages.FormatOpenAIChat, "/v1/chat/completions", `{"model":"gpt-x","max_tokens":10,"max_completion_tokens":30,"n":3,"stream":true,"stream_options":{"include_usage":true}}`,
			usage.Request{Model: "gpt-x", Stream: true, IncludeUsage: true}, usage.Bounds{MaxOutput: 30, Choices: 3}},
		{"chat keys by exact name", messages.FormatOpenAIChat, "/v1/chat/completions", `{"model":"gpt-x","stream":true,"Stream":false,"MAX_TOKENS":5}`,
			usage.Request{Model: "gpt-x", Stream: true}, usage.Bounds{}},
		{"repeated key: the last", messages.FormatOpenAIChat, "/v1/chat/completions", `{"model":"a","model":"b","stream":false,"stream":true}`,
			usage.Request{Model: "b", Stream: true}, usage.Bounds{}},
		{"responses background", messages.FormatOpenAIResponses, "/v1/responses", `{"model":"gpt-5","max_output_tokens":16,"background":true}`,
			usage.Request{Model: "gpt-5"}, usage.Bounds{MaxOutput: 16, Background: true}},
		{"gemini camel and snake", messages.FormatGemini, "/v1beta/models/gemini-2.5-pro:streamGenerateContent",
			`{"generationConfig":{"maxOutputTokens":"100","candidateCount":2},"generation_config":{"max_output_tokens":300}}`,
			usage.Request{Model: "gemini-2.5-pro", Stream: true}, usage.Bounds{MaxOutput: 300, Choices: 2}},
		{"code assist", messages.FormatGeminiCodeAssist, "/v1internal:streamGenerateContent?alt=sse",
			`{"model":"gemini-2.5-pro","project":"p-1","request":{"contents":[],"generationConfig":{"maxOutputTokens":200,"candidateCount":2}}}`,
			usage.Request{Model: "gemini-2.5-pro", Stream: true}, usage.Bounds{MaxOutput: 200, Choices: 2}},
		{"code assist snake, top-level config not read", messages.FormatGeminiCodeAssist, "/v1internal:generateContent",
			`{"model":"gemini-2.5-flash","generationConfig":{"maxOutputTokens":9},"request":{"generation_config":{"max_output_tokens":300}}}`,
			usage.Request{Model: "gemini-2.5-flash"}, usage.Bounds{MaxOutput: 300}},
		{"vertex claude", messages.FormatAnthropic, "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict",
			`{"anthropic_version":"vertex-2023-10-16","max_tokens":512,"stream":true,"messages":[]}`,
			usage.Request{Model: "claude-sonnet-4-5@20250929", Stream: true}, usage.Bounds{MaxOutput: 512}},
		{"vertex claude: the path's model, not the body's", messages.FormatAnthropic, "/v1/projects/p/locations/global/publishers/anthropic/models/claude-opus-4-1:rawPredict",
			`{"anthropic_version":"vertex-2023-10-16","model":"claude-haiku-4-5","max_tokens":64}`,
			usage.Request{Model: "claude-opus-4-1"}, usage.Bounds{MaxOutput: 64}},
		{"bad counts are none", messages.FormatAnthropic, "/v1/messages", `{"model":"m","max_tokens":-1}`,
			usage.Request{Model: "m"}, usage.Bounds{}},
		{"fraction is none", messages.FormatAnthropic, "/v1/messages", `{"model":"m","max_tokens":1.5}`,
			usage.Request{Model: "m"}, usage.Bounds{}},
		{"huge saturates", messages.FormatAnthropic, "/v1/messages", `{"model":"m","max_tokens":1e300}`,
			usage.Request{Model: "m"}, usage.Bounds{MaxOutput: 1<<63 - 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req, b, body := usage.ReadRequest(tc.format, tc.path, io.NopCloser(strings.NewReader(tc.body)), 1<<10)
			tc.req.Format = tc.format
			tc.b.Whole, tc.b.Size = true, int64(len(tc.body))
			tc.b.Choices = max(tc.b.Choices, 1)
			require.Equal(t, tc.req, req)
			require.Equal(t, tc.b, b)
			got, err := io.ReadAll(body)
			require.NoError(t, err)
			require.Equal(t, tc.body, string(got), "the body is replayed as it was")
		})
	}
	for _, body := range []string{strings.Repeat(" ", 2<<10) + "{}", "not json", "[1]", "null"} {
		_, b, rb := usage.ReadRequest(messages.FormatAnthropic, "/v1/messages", io.NopCloser(strings.NewReader(body)), 1<<10)
		require.False(t, b.Whole, "%.20q", body)
		got, _ := io.ReadAll(rb)
		require.Equal(t, body, string(got))
		_, _, ok := usage.IncludeUsage(rb)
		require.False(t, ok)
	}
}

func TestIncludeUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`{"model":"m","stream":true,"messages":[{"content":"<a&b>"}]}`, `{"messages":[{"content":"<a&b>"}],"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream_options":{"include_usage":false,"other":1}}`, `{"stream":true,"stream_options":{"include_usage":true,"other":1}}`},
		{`{"stream":true,"stream_options":null}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream":true,"stream_options":{}}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
	} {
		_, _, body := usage.ReadRequest(messages.FormatOpenAIChat, "/v1/chat/completions", io.NopCloser(strings.NewReader(tc.in)), 1<<10)
		rb, n, ok := usage.IncludeUsage(body)
		require.True(t, ok, tc.in)
		got, err := io.ReadAll(rb)
		require.NoError(t, err)
		require.Equal(t, tc.want, string(got))
		require.EqualValues(t, len(got), n)
		require.True(t, json.Valid(got))
	}
	_, _, body := usage.ReadRequest(messages.FormatOpenAIChat, "/v1/chat/completions", io.NopCloser(strings.NewReader(`{"stream":true,"stream_options":"x"}`)), 1<<10)
	_, _, ok := usage.IncludeUsage(body)
	require.False(t, ok, "stream_options that is not an object is left to the provider to refuse")
}
