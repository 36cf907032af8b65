package usage_test

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// fuzzFormats are the formats a fuzz input picks from.
var fuzzFormats = []string{messages.FormatAnthropic, messages.FormatOpenAIChat, messages.FormatOpenAIResponses, messages.FormatGemini, "",
	messages.FormatGeminiCodeAssist}

// fuzzTypes are the content types a fuzz input picks from.
var fuzzTypes = []string{"text/event-stream", "application/json", "text/event-stream; charset=utf-8", ""}

// FuzzWrap feeds any bytes as any format's response, split in reads of
// random sizes: Wrap never panics, passes every byte through unchanged,
// calls done once, and reads the same usage however the body was split.
// go test runs the seed corpus (every testdata response); go test -fuzz
// FuzzWrap explores.
func FuzzWrap(f *testing.F) {
	for i, tc := range wrapCases {
		f.Add(uint8(i), uint8(i), fixture(f, tc.fixture), uint64(i), uint16(0))
		f.Add(uint8(i+1), uint8(i), fixture(f, tc.fixture), uint64(i), uint16(200))
	}
	f.Add(uint8(0), uint8(0), []byte("data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1}}}\r\n\r"), uint64(7), uint16(64))
	f.Add(uint8(3), uint8(1), []byte(`[{"usageMetadata":{"promptTokenCount":1}},`), uint64(7), uint16(0))
	f.Add(uint8(5), uint8(1), []byte(`[{"response":{"usageMetadata":{"promptTokenCount":1,"toolUsePromptTokenCount":2}}},{"response":null}]`), uint64(8), uint16(0))
	f.Add(uint8(2), uint8(0), []byte("data: {\"response\":{\"usage\":{\"input_tokens\":1,\"input_tokens_details\":{\"cached_tokens\":2,\"cache_write_tokens\":3}},\"output\":[{\"type\":\"web_search_call\"},7]}}\n\n"), uint64(9), uint16(0))
	f.Add(uint8(1), uint8(1), []byte(`{"model":"m","service_tier":"priority","usage":{"prompt_tokens":1}}`), uint64(11), uint16(0))
	f.Add(uint8(0), uint8(0), []byte("data: {\"type\":\"message_delta\",\"usage\":{\"cache_creation_input_tokens\":1,\"cache_creation\":{\"ephemeral_1h_input_tokens\":5},\"server_tool_use\":{\"web_search_requests\":3}}}\n\n"), uint64(10), uint16(0))
	f.Fuzz(func(t *testing.T, format, ct uint8, data []byte, seed uint64, max uint16) {
		fm := fuzzFormats[int(format)%len(fuzzFormats)]
		typ := fuzzTypes[int(ct)%len(fuzzTypes)]
		maxJSON := int64(max) // 0: the default
		req := usage.Request{Format: fm, Model: "m", Stream: seed%2 == 0}
		want := wrapRead(t, fm, req, 200, typ, data, whole, maxJSON)
		require.Equal(t, want, wrapRead(t, fm, req, 200, typ, data, randomSizes(seed), maxJSON))
		require.Equal(t, want, wrapRead(t, fm, req, 200, typ, data, oneByte, maxJSON))
		if !want.Known {
			require.Zero(t, want.Tokens)
			require.Zero(t, want.WebSearches)
			require.Empty(t, want.Tier)
		}
		require.LessOrEqual(t, len(want.Tier), 64, "a tier's name is bounded")
		tk := want.Tokens
		require.GreaterOrEqual(t, min(tk.Input, tk.Output, tk.CacheRead, tk.CacheWrite, tk.CacheWrite1h, want.WebSearches), int64(0))
		require.LessOrEqual(t, tk.CacheWrite1h, tk.CacheWrite, "the one-hour writes are a part of the writes")
		// An error status is passed on unread.
		require.Equal(t, usage.Result{Model: "m", Stream: strings.HasPrefix(typ, "text/event-stream")}, wrapRead(t, fm, req, 500, typ, data, randomSizes(seed), maxJSON))
	})
}

// FuzzRequestInfo reads any body as any format's request: the body it
// returns replays the input byte for byte, whatever the bound and however
// the body is split; a body past the bound yields no model.
func FuzzRequestInfo(f *testing.F) {
	f.Add(uint8(0), "/v1/messages", []byte(`{"model":"claude-sonnet-4-5","stream":true}`), int64(1<<10), uint64(1))
	f.Add(uint8(1), "/v1/chat/completions", []byte(`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true}}`), int64(20), uint64(2))
	f.Add(uint8(2), "/v1/responses", []byte(`{"model":"gpt-5","input":"hi"}`), int64(0), uint64(3))
	f.Add(uint8(3), "/v1beta/models/gemini-2.5-pro:streamGenerateContent", []byte(`{}`), int64(-1), uint64(4))
	f.Add(uint8(4), "/", []byte(nil), int64(1), uint64(5))
	f.Add(uint8(5), "/v1internal:streamGenerateContent?alt=sse", []byte(`{"model":"gemini-2.5-pro","request":{}}`), int64(1<<10), uint64(6))
	f.Add(uint8(0), "/v1/projects/p/locations/l/publishers/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict",
		[]byte(`{"anthropic_version":"vertex-2023-10-16","stream":true}`), int64(8), uint64(7))
	f.Fuzz(func(t *testing.T, format uint8, path string, data []byte, max int64, seed uint64) {
		fm := fuzzFormats[int(format)%len(fuzzFormats)]
		var got []usage.Request
		for _, sizes := range []func() int{whole, randomSizes(seed)} {
			req, body := requestInfo(fm, path, io.NopCloser(&chunks{data: bytes.Clone(data), sizes: sizes}), max)
			b, err := io.ReadAll(body)
			require.NoError(t, err)
			require.Equal(t, string(data), string(b))
			require.NoError(t, body.Close())
			require.Equal(t, fm, req.Format)
			// Past the bound, a request is what its path says.
			byPath, _ := requestInfo(fm, path, nil, max)
			if fm != messages.FormatGemini && int64(len(data)) > max {
				require.Equal(t, byPath, req)
			}
			if byPath.Model != "" {
				require.Equal(t, byPath.Model, req.Model, "a model the path names is kept")
			}
			if fm != messages.FormatOpenAIChat {
				require.False(t, req.IncludeUsage)
			}
			got = append(got, req)
		}
		require.Equal(t, got[0], got[1])
		if fm == "" {
			require.Equal(t, usage.Request{}, got[0])
		}
	})
}

// FuzzReadRequest reads any body as any format's request with its bounds:
// the body it returns replays the input byte for byte, however the body
// is split; what the path says is kept (the model it names, a streaming
// method); the bounds are never negative and ask for at least one answer.
func FuzzReadRequest(f *testing.F) {
	f.Add(uint8(0), "/v1/messages", []byte(`{"model":"claude-sonnet-4-5","max_tokens":10,"stream":true}`), int64(1<<10), uint64(1))
	f.Add(uint8(1), "/v1/chat/completions", []byte(`{"model":"gpt-4o","n":2,"max_tokens":"7","stream":true}`), int64(1<<10), uint64(2))
	f.Add(uint8(2), "/v1/responses", []byte(`{"model":"gpt-5","max_output_tokens":16,"background":true}`), int64(1<<10), uint64(3))
	f.Add(uint8(3), "/v1beta/models/gemini-2.5-pro:streamGenerateContent", []byte(`{"generationConfig":{"maxOutputTokens":5}}`), int64(1<<10), uint64(4))
	f.Add(uint8(5), "/v1internal:streamGenerateContent?alt=sse",
		[]byte(`{"model":"gemini-2.5-pro","request":{"generationConfig":{"maxOutputTokens":9,"candidateCount":2}}}`), int64(1<<10), uint64(6))
	f.Add(uint8(0), "/v1/projects/p/locations/l/publishers/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict",
		[]byte(`{"anthropic_version":"vertex-2023-10-16","model":"x","max_tokens":3}`), int64(1<<10), uint64(7))
	f.Fuzz(func(t *testing.T, format uint8, path string, data []byte, max int64, seed uint64) {
		fm := fuzzFormats[int(format)%len(fuzzFormats)]
		byPath, _, _ := usage.ReadRequest(fm, path, nil, max)
		var got []usage.Bounds
		for _, sizes := range []func() int{whole, randomSizes(seed)} {
			req, b, body := usage.ReadRequest(fm, path, io.NopCloser(&chunks{data: bytes.Clone(data), sizes: sizes}), max)
			read, err := io.ReadAll(body)
			require.NoError(t, err)
			require.Equal(t, string(data), string(read))
			require.NoError(t, body.Close())
			require.Equal(t, fm, req.Format)
			if byPath.Model != "" {
				require.Equal(t, byPath.Model, req.Model, "a model the path names is kept")
			}
			if byPath.Stream {
				require.True(t, req.Stream, "a streaming method streams")
			}
			require.GreaterOrEqual(t, b.MaxOutput, int64(0))
			require.GreaterOrEqual(t, b.Choices, int64(1))
			require.GreaterOrEqual(t, b.WebSearches, int64(0))
			if !b.Whole {
				require.Zero(t, b.Size)
			}
			got = append(got, b)
		}
		require.Equal(t, got[0], got[1])
	})
}
