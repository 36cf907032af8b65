package usage_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

func TestDetect(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		method, path string
		want         string
	}{
		{"POST", "/v1/messages", messages.FormatAnthropic},
		{"POST", "/anthropic/v1/messages", messages.FormatAnthropic},
		{"POST", "/v1/messages/count_tokens", ""},
		{"POST", "/v1/messages/batches", ""},
		{"GET", "/v1/messages", ""},
		{"POST", "/v1/chat/completions", messages.FormatOpenAIChat},
		{"POST", "/openai/deployments/gpt-4o/chat/completions", messages.FormatOpenAIChat},
		{"POST", "/v1/chat/completions?api-version=2024-10-21", messages.FormatOpenAIChat},
		{"POST", "/v1/completions", ""},
		{"POST", "/v1/responses", messages.FormatOpenAIResponses},
		{"POST", "/backend-api/codex/responses", messages.FormatOpenAIResponses},
		{"GET", "/v1/responses/resp_123", ""},
		{"POST", "/v1/responses/resp_123/cancel", ""},
		{"POST", "/v1/responses/input_tokens", ""},
		{"POST", "/v1beta/models/gemini-2.5-pro:generateContent", messages.FormatGemini},
		{"POST", "/v1beta/models/gemini-2.5-flash:streamGenerateContent", messages.FormatGemini},
		{"POST", "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-pro:streamGenerateContent", messages.FormatGemini},
		{"POST", "/v1beta/models/gemini-2.5-pro:countTokens", ""},
		{"POST", "/v1beta/gemini-2.5-pro:generateContent", ""},
		// Gemini CLI logged in with a Google account: Code Assist.
		{"POST", "/v1internal:streamGenerateContent", messages.FormatGeminiCodeAssist},
		{"POST", "/v1internal:streamGenerateContent?alt=sse", messages.FormatGeminiCodeAssist},
		{"POST", "/v1internal:generateContent", messages.FormatGeminiCodeAssist},
		{"POST", "/v1internal:countTokens", ""},
		{"POST", "/v1internal:loadCodeAssist", ""},
		// Claude on Vertex AI (the Anthropic SDK's vertex middleware's paths).
		{"POST", "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict", messages.FormatAnthropic},
		{"POST", "/v1/projects/p/locations/global/publishers/anthropic/models/claude-opus-4-1@20250805:rawPredict", messages.FormatAnthropic},
		{"POST", "/v1/projects/p/locations/us-east5/publishers/anthropic/models/count-tokens:rawPredict", ""},
		{"POST", "/v1/projects/p/locations/us-east5/publishers/meta/models/llama-4:rawPredict", ""},
		{"POST", "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:predict", ""},
		{"post", "/v1/messages", ""},
		{"POST", "/", ""},
		{"POST", "", ""},
	} {
		require.Equal(t, tc.want, usage.Detect(tc.method, tc.path), "%s %s", tc.method, tc.path)
	}
}

func TestRequestInfo(t *testing.T) {
	t.Parallel()
	const max = 1 << 10
	for _, tc := range []struct {
		name   string
		format string
		path   string
		body   string
		want   usage.Request
	}{
		{name: "anthropic", format: messages.FormatAnthropic, path: "/v1/messages",
			body: `{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":"hi"}]}`,
			want: usage.Request{Format: messages.FormatAnthropic, Model: "claude-sonnet-4-5"}},
		{name: "anthropic stream", format: messages.FormatAnthropic, path: "/v1/messages",
			body: `{"max_tokens":1024,"messages":[{"role":"user","content":"{\"model\":\"no\"}"}],"stream":true,"model":"claude-opus-4-1"}`,
			want: usage.Request{Format: messages.FormatAnthropic, Model: "claude-opus-4-1", Stream: true}},
		{name: "anthropic with stream_options is not OpenAI", format: messages.FormatAnthropic, path: "/v1/messages",
			body: `{"model":"c","stream":true,"stream_options":{"include_usage":true}}`,
			want: usage.Request{Format: messages.FormatAnthropic, Model: "c", Stream: true}},
		{name: "chat stream with usage", format: messages.FormatOpenAIChat, path: "/v1/chat/completions",
			body: `{"model":"gpt-4o","messages":[],"stream":true,"stream_options":{"include_usage":true}}`,
			want: usage.Request{Format: messages.FormatOpenAIChat, Model: "gpt-4o", Stream: true, IncludeUsage: true}},
		{name: "chat stream without usage", format: messages.FormatOpenAIChat, path: "/v1/chat/completions",
			body: `{"model":"gpt-4o","messages":[],"stream":true}`,
			want: usage.Request{Format: messages.FormatOpenAIChat, Model: "gpt-4o", Stream: true}},
		{name: "chat with include_usage false", format: messages.FormatOpenAIChat, path: "/v1/chat/completions",
			body: `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":false}}`,
			want: usage.Request{Format: messages.FormatOpenAIChat, Model: "gpt-4o", Stream: true}},
		{name: "chat with null stream_options", format: messages.FormatOpenAIChat, path: "/v1/chat/completions",
			body: `{"model":"gpt-4o","stream":false,"stream_options":null}`,
			want: usage.Request{Format: messages.FormatOpenAIChat, Model: "gpt-4o"}},
		{name: "responses", format: messages.FormatOpenAIResponses, path: "/v1/responses",
			body: `{"model":"gpt-5-codex","input":"hi","stream":true}`,
			want: usage.Request{Format: messages.FormatOpenAIResponses, Model: "gpt-5-codex", Stream: true}},
		{name: "gemini from the path", format: messages.FormatGemini, path: "/v1beta/models/gemini-2.5-pro:generateContent",
			body: `{"contents":[{"parts":[{"text":"hi"}]}]}`,
			want: usage.Request{Format: messages.FormatGemini, Model: "gemini-2.5-pro"}},
		{name: "gemini stream from the path", format: messages.FormatGemini, path: "/v1beta/models/gemini-2.5-flash:streamGenerateContent",
			body: `not even JSON`,
			want: usage.Request{Format: messages.FormatGemini, Model: "gemini-2.5-flash", Stream: true}},
		{name: "vertex gemini", format: messages.FormatGemini, path: "/v1/projects/p/locations/l/publishers/google/models/gemini-2.5-pro:streamGenerateContent",
			want: usage.Request{Format: messages.FormatGemini, Model: "gemini-2.5-pro", Stream: true}},
		{name: "gemini with a query", format: messages.FormatGemini, path: "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
			want: usage.Request{Format: messages.FormatGemini, Model: "gemini-2.5-pro", Stream: true}},
		{name: "gemini path without a model", format: messages.FormatGemini, path: "/v1beta/tunedModels/x:generateContent",
			want: usage.Request{Format: messages.FormatGemini}},
		{name: "gemini path without a method", format: messages.FormatGemini, path: "/v1beta/models/gemini-2.5-pro",
			want: usage.Request{Format: messages.FormatGemini}},
		{name: "code assist", format: messages.FormatGeminiCodeAssist, path: "/v1internal:generateContent",
			body: `{"model":"gemini-2.5-flash","project":"p-123","user_prompt_id":"u1","request":{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}}`,
			want: usage.Request{Format: messages.FormatGeminiCodeAssist, Model: "gemini-2.5-flash"}},
		{name: "code assist stream", format: messages.FormatGeminiCodeAssist, path: "/v1internal:streamGenerateContent?alt=sse",
			body: `{"model":"gemini-2.5-pro","project":"p-123","request":{"contents":[],"generationConfig":{"maxOutputTokens":64}}}`,
			want: usage.Request{Format: messages.FormatGeminiCodeAssist, Model: "gemini-2.5-pro", Stream: true}},
		{name: "vertex anthropic stream, the model from the path", format: messages.FormatAnthropic,
			path: "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict",
			body: `{"anthropic_version":"vertex-2023-10-16","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			want: usage.Request{Format: messages.FormatAnthropic, Model: "claude-sonnet-4-5@20250929", Stream: true}},
		{name: "vertex anthropic", format: messages.FormatAnthropic,
			path: "/v1/projects/p/locations/global/publishers/anthropic/models/claude-haiku-4-5@20251001:rawPredict",
			body: `{"anthropic_version":"vertex-2023-10-16","max_tokens":1024,"messages":[]}`,
			want: usage.Request{Format: messages.FormatAnthropic, Model: "claude-haiku-4-5@20251001"}},
		{name: "vertex anthropic body past the bound", format: messages.FormatAnthropic,
			path: "/v1/projects/p/locations/global/publishers/anthropic/models/claude-haiku-4-5@20251001:streamRawPredict",
			body: `{"stream":true,"system":"` + strings.Repeat("x", max) + `"}`,
			want: usage.Request{Format: messages.FormatAnthropic, Model: "claude-haiku-4-5@20251001", Stream: true}},
		{name: "not JSON", format: messages.FormatAnthropic, path: "/v1/messages", body: `model=claude`,
			want: usage.Request{Format: messages.FormatAnthropic}},
		{name: "truncated JSON", format: messages.FormatOpenAIChat, path: "/v1/chat/completions", body: `{"model":"gpt-4o","stream":true`,
			want: usage.Request{Format: messages.FormatOpenAIChat}},
		{name: "fields of the wrong type", format: messages.FormatOpenAIChat, path: "/v1/chat/completions",
			body: `{"model":42,"stream":"yes","stream_options":{"include_usage":true}}`,
			want: usage.Request{Format: messages.FormatOpenAIChat, IncludeUsage: true}},
		{name: "a JSON array", format: messages.FormatAnthropic, path: "/v1/messages", body: `[{"model":"c"}]`,
			want: usage.Request{Format: messages.FormatAnthropic}},
		{name: "past the bound", format: messages.FormatAnthropic, path: "/v1/messages",
			body: `{"model":"claude-sonnet-4-5","stream":true,"system":"` + strings.Repeat("x", max) + `"}`,
			want: usage.Request{Format: messages.FormatAnthropic}},
		{name: "exactly the bound", format: messages.FormatAnthropic, path: "/v1/messages",
			body: `{"model":"c","system":"` + strings.Repeat("x", max-len(`{"model":"c","system":""}`)) + `"}`,
			want: usage.Request{Format: messages.FormatAnthropic, Model: "c"}},
		{name: "empty", format: messages.FormatAnthropic, path: "/v1/messages",
			want: usage.Request{Format: messages.FormatAnthropic}},
		{name: "unknown format", format: "", path: "/v1/models", body: `{"model":"c"}`,
			want: usage.Request{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, r := range []func(io.Reader) io.Reader{
				func(r io.Reader) io.Reader { return r },
				iotest.OneByteReader,
				iotest.HalfReader,
			} {
				closed := false
				body := &closeRecorder{Reader: r(strings.NewReader(tc.body)), closed: &closed}
				got, replay := requestInfo(tc.format, tc.path, body, max)
				require.Equal(t, tc.want, got)
				b, err := io.ReadAll(replay)
				require.NoError(t, err)
				require.Equal(t, tc.body, string(b), "the body must go upstream unchanged")
				require.NoError(t, replay.Close())
				require.True(t, closed, "Close must close the original body")
			}
		})
	}
}

// closeRecorder is a body that records its Close.
type closeRecorder struct {
	io.Reader
	closed *bool
}

func (c *closeRecorder) Close() error { *c.closed = true; return nil }

// A read error while ReadRequest reads is replayed after the bytes read
// before it, for the request's sender to see.
func TestRequestInfoReadError(t *testing.T) {
	t.Parallel()
	boom := errors.New("connection reset")
	body := io.NopCloser(io.MultiReader(strings.NewReader(`{"model":"c",`), iotest.ErrReader(boom)))
	got, replay := requestInfo(messages.FormatAnthropic, "/v1/messages", body, 1<<10)
	require.Equal(t, usage.Request{Format: messages.FormatAnthropic}, got)
	b, err := io.ReadAll(replay)
	require.ErrorIs(t, err, boom)
	require.Equal(t, `{"model":"c",`, string(b))
}

// A body past the bound is not read further than the bound: the rest
// streams from the original body.
func TestRequestInfoReadsAtMostMax(t *testing.T) {
	t.Parallel()
	src := &countingReader{r: bytes.NewReader(bytes.Repeat([]byte("a"), 1<<20))}
	_, replay := requestInfo(messages.FormatOpenAIChat, "/v1/chat/completions", io.NopCloser(src), 100)
	require.LessOrEqual(t, src.n, int64(101+512), "read past the bound before anyone asked")
	n, err := io.Copy(io.Discard, replay)
	require.NoError(t, err)
	require.Equal(t, int64(1<<20), n)
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// A nil body and max <= 0 are passed on as they are.
func TestRequestInfoNoBody(t *testing.T) {
	t.Parallel()
	got, body := requestInfo(messages.FormatAnthropic, "/v1/messages", nil, 100)
	require.Nil(t, body)
	require.Equal(t, usage.Request{Format: messages.FormatAnthropic}, got)
	orig := io.NopCloser(strings.NewReader(`{"model":"c"}`))
	got, body = requestInfo(messages.FormatAnthropic, "/v1/messages", orig, 0)
	require.Equal(t, orig, body)
	require.Equal(t, usage.Request{Format: messages.FormatAnthropic}, got)
}
