package usage_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// Anthropic's message_delta usage is merged count by count into
// message_start's (envoyproxy/ai-gateway#2236): a delta with output_tokens
// alone keeps the input and cache counts message_start gave, and a delta
// repeating the cumulative input and cache counts does not add them again.
func TestAnthropicDeltaMerge(t *testing.T) {
	t.Parallel()
	stream := fixture(t, "anthropic-stream-server-tools.sse")
	req := usage.Request{Format: messages.FormatAnthropic, Model: "claude-opus-4-1", Stream: true}
	firstDelta := bytes.Index(stream, []byte("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2"))
	require.Positive(t, firstDelta)
	start := messages.Tokens{Input: 2679, CacheRead: 20480, CacheWrite: 3072, CacheWrite1h: 2048}
	for _, tc := range []struct {
		name string
		data []byte
		want usage.Result
	}{
		{name: "a delta with output_tokens alone", data: stream[:firstDelta],
			want: usage.Result{Model: "claude-opus-4-1-20250805", Tokens: with(start, 40), Known: true, Stream: true}},
		{name: "a delta repeating the cumulative counts", data: stream,
			want: usage.Result{Model: "claude-opus-4-1-20250805", Tokens: with(start, 512), WebSearches: 2, Known: true, Stream: true}},
		{name: "the same delta twice", data: append(bytes.Clone(stream), stream[bytes.LastIndex(stream, []byte("event: message_delta")):]...),
			want: usage.Result{Model: "claude-opus-4-1-20250805", Tokens: with(start, 512), WebSearches: 2, Known: true, Stream: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, sizes := range []func() int{whole, oneByte, randomSizes(9)} {
				require.Equal(t, tc.want, wrapRead(t, messages.FormatAnthropic, req, 200, ctSSE, tc.data, sizes, 0))
			}
		})
	}
}

// with returns t with output tokens out.
func with(t messages.Tokens, out int64) messages.Tokens {
	t.Output = out
	return t
}

// An OpenAI Responses stream cut before its terminal event has no usage,
// and no web searches counted: the searches are read with the usage, from
// the terminal Response's output.
func TestResponsesWebSearchesNeedTheTerminalEvent(t *testing.T) {
	t.Parallel()
	stream := fixture(t, "openai-responses-web-search.sse")
	cut := stream[:bytes.Index(stream, []byte("event: response.completed"))]
	req := usage.Request{Format: messages.FormatOpenAIResponses, Model: "gpt-5", Stream: true}
	require.Equal(t, usage.Result{Model: "gpt-5-2025-08-07", Stream: true},
		wrapRead(t, messages.FormatOpenAIResponses, req, 200, ctSSE, cut, whole, 0))
}

// Counts past what a provider could mean are kept in bounds: a one-hour
// cache write count larger than the cache writes is cut to them, a
// negative search count is none.
func TestOddServerToolCounts(t *testing.T) {
	t.Parallel()
	body := `{"model":"claude-x","usage":{"input_tokens":5,"output_tokens":1,"cache_creation_input_tokens":10,` +
		`"cache_creation":{"ephemeral_1h_input_tokens":99},"server_tool_use":{"web_search_requests":-4}}}`
	got := wrapRead(t, messages.FormatAnthropic, usage.Request{}, 200, ctJSON, []byte(body), whole, 0)
	require.Equal(t, usage.Result{Model: "claude-x", Tokens: messages.Tokens{Input: 5, Output: 1, CacheWrite: 10, CacheWrite1h: 10}, Known: true}, got)
}

// A response served at a dearer tier than the standard one says so
// (OpenAI's service_tier "priority" or "scale", Anthropic's usage.speed
// "fast" or usage.service_tier "priority"); the standard and the cheaper
// tiers (auto, default, flex, standard, batch) say nothing.
func TestServiceTier(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, format, ct, data, want string
	}{
		{"openai chat priority", messages.FormatOpenAIChat, ctJSON,
			`{"model":"gpt-5","service_tier":"priority","usage":{"prompt_tokens":5,"completion_tokens":2}}`, "service_tier priority"},
		{"openai chat default", messages.FormatOpenAIChat, ctJSON,
			`{"model":"gpt-5","service_tier":"default","usage":{"prompt_tokens":5,"completion_tokens":2}}`, ""},
		{"openai chat stream priority", messages.FormatOpenAIChat, ctSSE,
			"data: {\"model\":\"gpt-5\",\"service_tier\":\"priority\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n" +
				"data: {\"model\":\"gpt-5\",\"service_tier\":\"priority\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
			"service_tier priority"},
		{"openai responses stream scale", messages.FormatOpenAIResponses, ctSSE,
			"data: {\"type\":\"response.completed\",\"response\":{\"model\":\"gpt-5\",\"service_tier\":\"scale\",\"usage\":{\"input_tokens\":5,\"output_tokens\":2}}}\n\n",
			"service_tier scale"},
		{"openai responses flex", messages.FormatOpenAIResponses, ctJSON,
			`{"model":"gpt-5","service_tier":"flex","usage":{"input_tokens":5,"output_tokens":2}}`, ""},
		{"anthropic fast", messages.FormatAnthropic, ctJSON,
			`{"model":"claude-opus-4-6","usage":{"input_tokens":5,"output_tokens":2,"service_tier":"standard","speed":"fast"}}`, "speed fast"},
		{"anthropic stream priority", messages.FormatAnthropic, ctSSE,
			"data: {\"type\":\"message_start\",\"message\":{\"model\":\"c\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1,\"service_tier\":\"priority\"}}}\n\n" +
				"data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n",
			"service_tier priority"},
		{"anthropic batch and standard", messages.FormatAnthropic, ctJSON,
			`{"model":"c","usage":{"input_tokens":5,"output_tokens":2,"service_tier":"batch","speed":"standard"}}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, sizes := range []func() int{whole, oneByte} {
				got := wrapRead(t, tc.format, usage.Request{}, 200, tc.ct, []byte(tc.data), sizes, 0)
				require.True(t, got.Known)
				require.Equal(t, tc.want, got.Tier)
			}
		})
	}
}
