package usage_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

const (
	ctSSE  = "text/event-stream"
	ctJSON = "application/json"
)

// wrapCase is a response to read and the Result it must give.
type wrapCase struct {
	name    string
	format  string
	req     usage.Request
	status  int
	ct      string
	fixture string
	want    usage.Result
}

// wrapCases are the providers' documented response shapes, streamed and
// not, and the usage each says.
var wrapCases = []wrapCase{
	{
		name: "anthropic stream", format: messages.FormatAnthropic, status: 200, ct: ctSSE, fixture: "anthropic-stream.sse",
		req:  usage.Request{Format: messages.FormatAnthropic, Model: "claude-sonnet-4-5", Stream: true},
		want: usage.Result{Model: "claude-sonnet-4-5-20250929", Tokens: messages.Tokens{Input: 25, Output: 15}, Known: true, Stream: true},
	},
	{
		// message_delta's counts are cumulative: two deltas (89, then 96
		// with the input and cache counts repeated) give 96, not 185.
		name: "anthropic stream with cache and cumulative deltas", format: messages.FormatAnthropic, status: 200, ct: ctSSE, fixture: "anthropic-stream-cache.sse",
		req:  usage.Request{Format: messages.FormatAnthropic, Model: "claude-opus-4-1", Stream: true},
		want: usage.Result{Model: "claude-opus-4-1-20250805", Tokens: messages.Tokens{Input: 472, Output: 96, CacheRead: 20480, CacheWrite: 1024}, Known: true, Stream: true},
	},
	{
		name: "anthropic message", format: messages.FormatAnthropic, status: 200, ct: ctJSON, fixture: "anthropic-message.json",
		req:  usage.Request{Format: messages.FormatAnthropic, Model: "claude-sonnet-4-5"},
		want: usage.Result{Model: "claude-sonnet-4-5-20250929", Tokens: messages.Tokens{Input: 2095, Output: 503, CacheRead: 10000, CacheWrite: 2051}, Known: true},
	},
	{
		// The message object of the real Claude Code 2.1.332 recording
		// (../shared/agent-output): a Message with the CLI's newer usage
		// fields, several null. It was synthesised by the CLI, not sent by
		// the API, but it is the shape the CLI parses.
		name: "anthropic message recorded from claude 2.1.332", format: messages.FormatAnthropic, status: 200, ct: "application/json; charset=utf-8", fixture: "claude-2.1.332-synthetic-message.json",
		req:  usage.Request{Format: messages.FormatAnthropic, Model: "claude-opus-5-5"},
		want: usage.Result{Model: "<synthetic>", Known: true},
	},
	{
		name: "anthropic overloaded", format: messages.FormatAnthropic, status: 529, ct: ctJSON, fixture: "anthropic-error.json",
		req:  usage.Request{Format: messages.FormatAnthropic, Model: "claude-sonnet-4-5", Stream: true},
		want: usage.Result{Model: "claude-sonnet-4-5"},
	},
	{
		name: "openai chat stream with include_usage", format: messages.FormatOpenAIChat, status: 200, ct: ctSSE, fixture: "openai-chat-stream-usage.sse",
		req:  usage.Request{Format: messages.FormatOpenAIChat, Model: "gpt-4o", Stream: true, IncludeUsage: true},
		want: usage.Result{Model: "gpt-4o-2024-08-06", Tokens: messages.Tokens{Input: 86, Output: 300, CacheRead: 1920}, Known: true, Stream: true},
	},
	{
		name: "openai chat stream without include_usage", format: messages.FormatOpenAIChat, status: 200, ct: ctSSE, fixture: "openai-chat-stream-nousage.sse",
		req:  usage.Request{Format: messages.FormatOpenAIChat, Model: "gpt-4o", Stream: true},
		want: usage.Result{Model: "gpt-4o-2024-08-06", Stream: true},
	},
	{
		name: "openai chat completion", format: messages.FormatOpenAIChat, status: 200, ct: ctJSON, fixture: "openai-chat-completion.json",
		req:  usage.Request{Format: messages.FormatOpenAIChat, Model: "o4-mini"},
		want: usage.Result{Model: "o4-mini-2025-04-16", Tokens: messages.Tokens{Input: 93, Output: 1046, CacheRead: 1024}, Known: true},
	},
	{
		name: "openai rate limited", format: messages.FormatOpenAIChat, status: 429, ct: ctJSON, fixture: "openai-error.json",
		req:  usage.Request{Format: messages.FormatOpenAIChat, Model: "gpt-4o"},
		want: usage.Result{Model: "gpt-4o"},
	},
	{
		name: "openai responses stream", format: messages.FormatOpenAIResponses, status: 200, ct: ctSSE, fixture: "openai-responses-stream.sse",
		req:  usage.Request{Format: messages.FormatOpenAIResponses, Model: "gpt-5-codex", Stream: true},
		want: usage.Result{Model: "gpt-5-codex", Tokens: messages.Tokens{Input: 366, Output: 612, CacheRead: 4864}, Known: true, Stream: true},
	},
	{
		name: "openai responses stream incomplete", format: messages.FormatOpenAIResponses, status: 200, ct: ctSSE, fixture: "openai-responses-incomplete.sse",
		req:  usage.Request{Format: messages.FormatOpenAIResponses, Model: "gpt-5-codex", Stream: true},
		want: usage.Result{Model: "gpt-5-codex", Tokens: messages.Tokens{Input: 5230, Output: 256}, Known: true, Stream: true},
	},
	{
		name: "openai response", format: messages.FormatOpenAIResponses, status: 200, ct: ctJSON, fixture: "openai-responses-response.json",
		req:  usage.Request{Format: messages.FormatOpenAIResponses, Model: "gpt-4.1"},
		want: usage.Result{Model: "gpt-4.1-2025-04-14", Tokens: messages.Tokens{Input: 328, Output: 52}, Known: true},
	},
	{
		name: "gemini stream alt=sse", format: messages.FormatGemini, status: 200, ct: ctSSE, fixture: "gemini-stream.sse",
		req:  usage.Request{Format: messages.FormatGemini, Model: "gemini-2.5-pro", Stream: true},
		want: usage.Result{Model: "gemini-2.5-pro", Tokens: messages.Tokens{Input: 176, Output: 212, CacheRead: 1024}, Known: true, Stream: true},
	},
	{
		name: "gemini stream as a JSON array", format: messages.FormatGemini, status: 200, ct: "application/json; charset=UTF-8", fixture: "gemini-stream.json",
		req:  usage.Request{Format: messages.FormatGemini, Model: "gemini-2.5-pro", Stream: true},
		want: usage.Result{Model: "gemini-2.5-pro", Tokens: messages.Tokens{Input: 176, Output: 212, CacheRead: 1024}, Known: true, Stream: true},
	},
	{
		name: "gemini generateContent", format: messages.FormatGemini, status: 200, ct: "application/json; charset=UTF-8", fixture: "gemini-response.json",
		req:  usage.Request{Format: messages.FormatGemini, Model: "gemini-2.5-flash"},
		want: usage.Result{Model: "gemini-2.5-flash", Tokens: messages.Tokens{Input: 8, Output: 1032}, Known: true},
	},
	{
		name: "gemini quota", format: messages.FormatGemini, status: 429, ct: ctJSON, fixture: "gemini-error.json",
		req:  usage.Request{Format: messages.FormatGemini, Model: "gemini-2.5-flash", Stream: true},
		want: usage.Result{Model: "gemini-2.5-flash"},
	},
	{
		// A stream that ends response.failed after the model generated:
		// its usage is billed and read.
		name: "openai responses stream failed", format: messages.FormatOpenAIResponses, status: 200, ct: ctSSE, fixture: "openai-responses-failed.sse",
		req:  usage.Request{Format: messages.FormatOpenAIResponses, Model: "gpt-5", Stream: true},
		want: usage.Result{Model: "gpt-5-2025-08-07", Tokens: messages.Tokens{Input: 294, Output: 704, CacheRead: 1536}, Known: true, Stream: true},
	},
	{
		name: "openai response incomplete", format: messages.FormatOpenAIResponses, status: 200, ct: ctJSON, fixture: "openai-responses-incomplete.json",
		req:  usage.Request{Format: messages.FormatOpenAIResponses, Model: "gpt-5-mini"},
		want: usage.Result{Model: "gpt-5-mini-2025-08-07", Tokens: messages.Tokens{Input: 5230, Output: 16}, Known: true},
	},
	{
		// A failed Response sent with a 200 (a background response's
		// answer): its usage is read.
		name: "openai response failed with usage", format: messages.FormatOpenAIResponses, status: 200, ct: ctJSON, fixture: "openai-responses-failed.json",
		req:  usage.Request{Format: messages.FormatOpenAIResponses, Model: "o3"},
		want: usage.Result{Model: "o3-2025-04-16", Tokens: messages.Tokens{Input: 912, Output: 2048}, Known: true},
	},
	{
		// input_tokens includes the cached reads and the cache writes; the
		// two web_search_call items of the output are two searches (the
		// words in the text are not).
		name: "openai responses stream with web searches and cache writes", format: messages.FormatOpenAIResponses, status: 200, ct: ctSSE, fixture: "openai-responses-web-search.sse",
		req: usage.Request{Format: messages.FormatOpenAIResponses, Model: "gpt-5", Stream: true},
		want: usage.Result{Model: "gpt-5-2025-08-07", Tokens: messages.Tokens{Input: 2976, Output: 312, CacheRead: 4096, CacheWrite: 2048},
			WebSearches: 2, Known: true, Stream: true},
	},
	{
		// prompt_tokens includes cached_tokens and cache_write_tokens.
		name: "openai chat completion with cache writes", format: messages.FormatOpenAIChat, status: 200, ct: ctJSON, fixture: "openai-chat-cache-write.json",
		req:  usage.Request{Format: messages.FormatOpenAIChat, Model: "gpt-5.1"},
		want: usage.Result{Model: "gpt-5.1-2025-11-13", Tokens: messages.Tokens{Input: 568, Output: 410, CacheRead: 3072, CacheWrite: 2560}, Known: true},
	},
	{
		name: "anthropic message with one-hour cache writes and web searches", format: messages.FormatAnthropic, status: 200, ct: ctJSON, fixture: "anthropic-message-server-tools.json",
		req: usage.Request{Format: messages.FormatAnthropic, Model: "claude-sonnet-4-5"},
		want: usage.Result{Model: "claude-sonnet-4-5-20250929", Tokens: messages.Tokens{Input: 6039, Output: 931, CacheRead: 10000, CacheWrite: 3072, CacheWrite1h: 2048},
			WebSearches: 3, Known: true},
	},
	{
		// message_start's counts, a delta with output_tokens alone, then a
		// delta repeating the cumulative input and cache counts with the
		// searches.
		name: "anthropic stream with one-hour cache writes and web searches", format: messages.FormatAnthropic, status: 200, ct: ctSSE, fixture: "anthropic-stream-server-tools.sse",
		req: usage.Request{Format: messages.FormatAnthropic, Model: "claude-opus-4-1", Stream: true},
		want: usage.Result{Model: "claude-opus-4-1-20250805", Tokens: messages.Tokens{Input: 2679, Output: 512, CacheRead: 20480, CacheWrite: 3072, CacheWrite1h: 2048},
			WebSearches: 2, Known: true, Stream: true},
	},
	{
		// promptTokenCount includes cachedContentTokenCount;
		// toolUsePromptTokenCount is input on top of it; thoughtsTokenCount
		// is output on top of candidatesTokenCount.
		name: "gemini generateContent with tool-use prompt and thoughts", format: messages.FormatGemini, status: 200, ct: "application/json; charset=UTF-8", fixture: "gemini-response-tool-use.json",
		req:  usage.Request{Format: messages.FormatGemini, Model: "gemini-2.5-flash"},
		want: usage.Result{Model: "gemini-2.5-flash", Tokens: messages.Tokens{Input: 2252, Output: 1020, CacheRead: 2048}, Known: true},
	},
	{
		name: "gemini code assist stream", format: messages.FormatGeminiCodeAssist, status: 200, ct: ctSSE, fixture: "gemini-code-assist-stream.sse",
		req:  usage.Request{Format: messages.FormatGeminiCodeAssist, Model: "gemini-2.5-pro", Stream: true},
		want: usage.Result{Model: "gemini-2.5-pro", Tokens: messages.Tokens{Input: 992, Output: 432, CacheRead: 8190}, Known: true, Stream: true},
	},
	{
		name: "gemini code assist generateContent", format: messages.FormatGeminiCodeAssist, status: 200, ct: "application/json; charset=UTF-8", fixture: "gemini-code-assist-response.json",
		req:  usage.Request{Format: messages.FormatGeminiCodeAssist, Model: "gemini-2.5-flash"},
		want: usage.Result{Model: "gemini-2.5-flash", Tokens: messages.Tokens{Input: 1532, Output: 88}, Known: true},
	},
	{
		name: "unknown format", format: "", status: 200, ct: ctJSON, fixture: "anthropic-message.json",
		want: usage.Result{},
	},
	{
		name: "a stream sent as JSON", format: messages.FormatAnthropic, status: 200, ct: ctJSON, fixture: "anthropic-stream.sse",
		req:  usage.Request{Format: messages.FormatAnthropic, Model: "claude-sonnet-4-5", Stream: true},
		want: usage.Result{Model: "claude-sonnet-4-5"},
	},
	{
		name: "a JSON body sent as a stream", format: messages.FormatOpenAIChat, status: 200, ct: "text/event-stream; charset=utf-8", fixture: "openai-chat-completion.json",
		req:  usage.Request{Format: messages.FormatOpenAIChat, Model: "o4-mini"},
		want: usage.Result{Model: "o4-mini", Stream: true},
	},
}

func TestWrap(t *testing.T) {
	t.Parallel()
	for _, tc := range wrapCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := wrapRead(t, tc.format, tc.req, tc.status, tc.ct, fixture(t, tc.fixture), whole, 0)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestWrapNotJSON(t *testing.T) {
	t.Parallel()
	for _, format := range []string{messages.FormatAnthropic, messages.FormatOpenAIChat, messages.FormatOpenAIResponses, messages.FormatGemini} {
		for _, ct := range []string{ctJSON, ctSSE, "text/html"} {
			t.Run(format+" "+ct, func(t *testing.T) {
				t.Parallel()
				data := []byte("<html><body>502 Bad Gateway</body></html>\n\ndata: {not json\n\n")
				got := wrapRead(t, format, usage.Request{Model: "m"}, 200, ct, data, whole, 0)
				require.Equal(t, usage.Result{Model: "m", Stream: ct == ctSSE}, got)
			})
		}
	}
}

// Every fixture gives the same Result whatever the reads' sizes, with
// "\n" or "\r\n" line ends.
func TestWrapSplitReads(t *testing.T) {
	t.Parallel()
	for _, tc := range wrapCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			data := fixture(t, tc.fixture)
			crlf := bytes.ReplaceAll(bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n")), []byte("\n"), []byte("\r\n"))
			for _, d := range [][]byte{data, crlf} {
				require.Equal(t, tc.want, wrapRead(t, tc.format, tc.req, tc.status, tc.ct, d, oneByte, 0), "1-byte reads")
				for seed := range uint64(20) {
					require.Equal(t, tc.want, wrapRead(t, tc.format, tc.req, tc.status, tc.ct, d, randomSizes(seed), 0), "random reads, seed %d", seed)
				}
			}
		})
	}
}

// A server-sent event reaches the reader of the wrapped body as soon as it
// was read from the provider: nothing waits for more bytes.
func TestWrapPassesEventsAtOnce(t *testing.T) {
	t.Parallel()
	data := fixture(t, "anthropic-stream.sse")
	first := data[:bytes.Index(data, []byte("\n\n"))+2]
	pr, pw := io.Pipe()
	var rec results
	body := usage.Wrap(messages.FormatAnthropic, usage.Request{}, 200, ctSSE, pr, 0, rec.done)
	more := make(chan struct{})
	go func() {
		_, _ = pw.Write(first)
		<-more
		_, _ = pw.Write(data[len(first):])
		_ = pw.Close()
	}()

	got := make(chan []byte, 1)
	go func() {
		buf := make([]byte, 0, len(first))
		for len(buf) < len(first) {
			n, err := body.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
			if err != nil {
				break
			}
		}
		got <- buf
	}()
	select {
	case b := <-got:
		require.Equal(t, first, b)
	case <-time.After(10 * time.Second):
		t.Fatal("the first event did not pass before more was written")
	}
	require.Equal(t, 0, rec.count(), "done before the end")
	close(more)
	rest, err := io.ReadAll(body)
	require.NoError(t, err)
	require.Equal(t, data[len(first):], rest)
	require.NoError(t, body.Close())
	require.Equal(t, wrapCases[0].want.Tokens, rec.only(t).Tokens)
}

// A body closed (or broken) mid-stream reports once, with the usage read
// so far: Known only if a usage object had arrived.
func TestWrapEndedEarly(t *testing.T) {
	t.Parallel()
	stream := fixture(t, "anthropic-stream.sse")
	afterStart := bytes.Index(stream, []byte("event: content_block_start"))
	message := fixture(t, "anthropic-message.json")
	req := usage.Request{Format: messages.FormatAnthropic, Model: "claude-sonnet-4-5", Stream: true}
	for _, tc := range []struct {
		name string
		ct   string
		data []byte
		// err is the read error that ends the body; nil: it is closed.
		err  error
		want usage.Result
	}{
		{name: "closed after message_start", ct: ctSSE, data: stream[:afterStart],
			want: usage.Result{Model: "claude-sonnet-4-5-20250929", Tokens: messages.Tokens{Input: 25, Output: 1}, Known: true, Stream: true}},
		{name: "broken after message_start", ct: ctSSE, data: stream[:afterStart], err: io.ErrUnexpectedEOF,
			want: usage.Result{Model: "claude-sonnet-4-5-20250929", Tokens: messages.Tokens{Input: 25, Output: 1}, Known: true, Stream: true}},
		{name: "closed inside message_start", ct: ctSSE, data: stream[:afterStart-10],
			want: usage.Result{Model: "claude-sonnet-4-5", Stream: true}},
		{name: "closed before any byte", ct: ctSSE,
			want: usage.Result{Model: "claude-sonnet-4-5", Stream: true}},
		{name: "JSON closed half way", ct: ctJSON, data: message[:len(message)/2],
			want: usage.Result{Model: "claude-sonnet-4-5"}},
		{name: "JSON closed when whole, before EOF", ct: ctJSON, data: message,
			want: usage.Result{Model: "claude-sonnet-4-5-20250929", Tokens: messages.Tokens{Input: 2095, Output: 503, CacheRead: 10000, CacheWrite: 2051}, Known: true}},
		{name: "JSON broken when whole", ct: ctJSON, data: message, err: errors.New("connection reset"),
			want: usage.Result{Model: "claude-sonnet-4-5-20250929", Tokens: messages.Tokens{Input: 2095, Output: 503, CacheRead: 10000, CacheWrite: 2051}, Known: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pr, pw := io.Pipe()
			var rec results
			body := usage.Wrap(messages.FormatAnthropic, req, 200, tc.ct, pr, 0, rec.done)
			go func() {
				_, _ = pw.Write(tc.data)
				if tc.err != nil {
					_ = pw.CloseWithError(tc.err)
				}
			}()
			got, err := io.ReadAll(io.LimitReader(body, int64(len(tc.data))))
			require.NoError(t, err)
			require.Equal(t, string(tc.data), string(got))
			if tc.err != nil {
				_, err := body.Read(make([]byte, 1))
				require.ErrorIs(t, err, tc.err)
			}
			require.NoError(t, body.Close())
			_, err = body.Read(make([]byte, 1))
			require.Error(t, err, "a read after Close")
			require.NoError(t, body.Close())
			require.Equal(t, tc.want, rec.only(t))
		})
	}
}

// Close from another goroutine while Read runs, as net/http does: done is
// called exactly once, and -race finds nothing.
func TestWrapConcurrentClose(t *testing.T) {
	t.Parallel()
	data := fixture(t, "anthropic-stream-cache.sse")
	for i := range 200 {
		pr, pw := io.Pipe()
		var calls atomic.Int32
		body := usage.Wrap(messages.FormatAnthropic, usage.Request{}, 200, ctSSE, pr, 0, func(usage.Result) { calls.Add(1) })
		go func() {
			for {
				if _, err := pw.Write(data); err != nil {
					return
				}
			}
		}()
		var wg sync.WaitGroup
		wg.Go(func() {
			buf := make([]byte, 1+i%64)
			for {
				if _, err := body.Read(buf); err != nil {
					return
				}
			}
		})
		wg.Go(func() {
			time.Sleep(time.Duration(i%7) * 100 * time.Microsecond)
			_ = body.Close()
		})
		wg.Wait()
		require.NoError(t, body.Close())
		require.Equal(t, int32(1), calls.Load(), "iteration %d", i)
	}
}

// A line or event longer than maxJSON is skipped; the stream goes on
// passing every byte, and the usage in later events is still read.
func TestWrapLongLines(t *testing.T) {
	t.Parallel()
	start := `event: message_start` + "\n" +
		`data: {"type":"message_start","message":{"model":"claude-haiku-4-5","usage":{"input_tokens":10,"output_tokens":1}}}` + "\n\n"
	long := `event: content_block_delta` + "\n" +
		`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + strings.Repeat("x", 5000) + `"}}` + "\n\n"
	longMultiline := "data: {\"type\":\"message_delta\",\ndata: \"usage\":{\"output_tokens\":999," + strings.Repeat(" ", 3000) + "\ndata: \"input_tokens\":999}}\n\n"
	delta := `event: message_delta` + "\n" +
		`data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":42}}` + "\n\n"
	longDelta := `event: message_delta` + "\n" +
		`data: {"type":"message_delta","delta":{"stop_reason":"end_turn","pad":"` + strings.Repeat("y", 5000) + `"},"usage":{"output_tokens":43}}` + "\n\n"
	want := func(out int64) usage.Result {
		return usage.Result{Model: "claude-haiku-4-5", Tokens: messages.Tokens{Input: 10, Output: out}, Known: true, Stream: true}
	}
	for _, tc := range []struct {
		name string
		data string
		want usage.Result
	}{
		{name: "long delta skipped", data: start + long + delta, want: want(42)},
		{name: "long multi-line event skipped", data: start + longMultiline + delta, want: want(42)},
		{name: "long usage event skipped", data: start + delta + longDelta, want: want(42)},
		{name: "long line at the end", data: start + delta + long[:3000], want: want(42)},
		{name: "event of short lines past the bound skipped", want: want(42),
			data: start + delta + "data: {\"type\":\"message_delta\",\n" + strings.Repeat("data: "+strings.Repeat(" ", 400)+"\n", 3) + "data: \"usage\":{\"output_tokens\":44}}\n\n"},
		{name: "event of short lines within the bound read", want: want(45),
			data: start + delta + "data: {\"type\":\"message_delta\",\n" + strings.Repeat("data: "+strings.Repeat(" ", 200)+"\n", 3) + "data: \"usage\":{\"output_tokens\":45}}\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, sizes := range []func() int{whole, oneByte, randomSizes(1), randomSizes(2)} {
				got := wrapRead(t, messages.FormatAnthropic, usage.Request{}, 200, ctSSE, []byte(tc.data), sizes, 1024)
				require.Equal(t, tc.want, got)
			}
		})
	}
}

// Events larger than the buffers kept between events (64 KiB) are read
// within the default bound.
func TestWrapLargeEvents(t *testing.T) {
	t.Parallel()
	text := strings.Repeat("z", 200<<10)
	data := "event: message_start\n" +
		`data: {"type":"message_start","message":{"model":"claude-haiku-4-5","usage":{"input_tokens":10,"output_tokens":1}}}` + "\n\n" +
		`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + text + `"}}` + "\n\n" +
		`data: {"type":"message_delta","pad":"` + text + `","usage":{"output_tokens":70000}}` + "\n\n"
	want := usage.Result{Model: "claude-haiku-4-5", Tokens: messages.Tokens{Input: 10, Output: 70000}, Known: true, Stream: true}
	for _, sizes := range []func() int{whole, randomSizes(4)} {
		require.Equal(t, want, wrapRead(t, messages.FormatAnthropic, usage.Request{}, 200, ctSSE, []byte(data), sizes, 0))
	}
}

// A JSON body past maxJSON passes through whole; its usage is unknown.
func TestWrapJSONPastBound(t *testing.T) {
	t.Parallel()
	data := fixture(t, "openai-chat-completion.json")
	req := usage.Request{Format: messages.FormatOpenAIChat, Model: "o4-mini"}
	require.Equal(t, usage.Result{Model: "o4-mini"}, wrapRead(t, messages.FormatOpenAIChat, req, 200, ctJSON, data, randomSizes(3), int64(len(data)-1)))
	require.True(t, wrapRead(t, messages.FormatOpenAIChat, req, 200, ctJSON, data, randomSizes(3), int64(len(data))).Known)
}

// A last event the stream did not end with a blank line still counts.
func TestWrapLastEventWithoutBlankLine(t *testing.T) {
	t.Parallel()
	data := bytes.TrimRight(fixture(t, "gemini-stream.sse"), "\r\n")
	got := wrapRead(t, messages.FormatGemini, usage.Request{}, 200, ctSSE, data, oneByte, 0)
	require.Equal(t, usage.Result{Model: "gemini-2.5-pro", Tokens: messages.Tokens{Input: 176, Output: 212, CacheRead: 1024}, Known: true, Stream: true}, got)
}

// Odd but valid streams: comments, "data:" without a space, counts of the
// wrong type, a usage chunk after others, a cached count larger than the
// prompt.
func TestWrapOddStreams(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		format string
		data   string
		want   usage.Result
	}{
		{name: "comments and no space", format: messages.FormatOpenAIChat,
			data: ": keep-alive\n\ndata:{\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n: done\ndata: [DONE]\n\n",
			want: usage.Result{Model: "gpt-4o", Tokens: messages.Tokens{Input: 5, Output: 2}, Known: true, Stream: true}},
		{name: "latest chat usage wins", format: messages.FormatOpenAIChat,
			data: "data: {\"model\":\"m\",\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\ndata: {\"model\":\"m\",\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7}}\n\n",
			want: usage.Result{Model: "m", Tokens: messages.Tokens{Input: 5, Output: 7}, Known: true, Stream: true}},
		{name: "count of the wrong type", format: messages.FormatAnthropic,
			data: "data: {\"type\":\"message_start\",\"message\":{\"model\":\"c\",\"usage\":{\"input_tokens\":\"ten\"}}}\n\n",
			want: usage.Result{Stream: true}},
		{name: "null counts in a delta keep message_start's", format: messages.FormatAnthropic,
			data: "data: {\"type\":\"message_start\",\"message\":{\"model\":\"c\",\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":4,\"output_tokens\":1}}}\n\n" +
				"data: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":null,\"cache_read_input_tokens\":0,\"output_tokens\":30}}\n\n",
			want: usage.Result{Model: "c", Tokens: messages.Tokens{Input: 10, Output: 30, CacheRead: 4}, Known: true, Stream: true}},
		{name: "cached more than prompt", format: messages.FormatGemini,
			data: "data: {\"usageMetadata\":{\"promptTokenCount\":3,\"cachedContentTokenCount\":9,\"candidatesTokenCount\":1}}\n\n",
			want: usage.Result{Tokens: messages.Tokens{Output: 1, CacheRead: 3}, Known: true, Stream: true}},
		{name: "negative counts", format: messages.FormatOpenAIResponses,
			data: "data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":-3,\"output_tokens\":-1}}}\n\n",
			want: usage.Result{Known: true, Stream: true}},
		{name: "responses failed without usage", format: messages.FormatOpenAIResponses,
			data: "data: {\"type\":\"response.failed\",\"response\":{\"model\":\"gpt-5\",\"status\":\"failed\",\"usage\":null}}\n\n",
			want: usage.Result{Model: "gpt-5", Stream: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, sizes := range []func() int{whole, oneByte} {
				require.Equal(t, tc.want, wrapRead(t, tc.format, usage.Request{}, 200, ctSSE, []byte(tc.data), sizes, 0))
			}
		})
	}
}

// done may be nil.
func TestWrapNilDone(t *testing.T) {
	t.Parallel()
	data := fixture(t, "anthropic-stream.sse")
	body := usage.Wrap(messages.FormatAnthropic, usage.Request{}, 200, ctSSE, io.NopCloser(bytes.NewReader(data)), 0, nil)
	got, err := io.ReadAll(body)
	require.NoError(t, err)
	require.Equal(t, data, got)
	require.NoError(t, body.Close())
}

// Close returns the body's Close error.
func TestWrapCloseError(t *testing.T) {
	t.Parallel()
	var rec results
	closeErr := fmt.Errorf("close failed")
	body := usage.Wrap(messages.FormatAnthropic, usage.Request{}, 200, ctJSON, errCloser{closeErr}, 0, rec.done)
	require.ErrorIs(t, body.Close(), closeErr)
	require.False(t, rec.only(t).Known)
}

// errCloser is an empty body whose Close fails.
type errCloser struct{ err error }

func (errCloser) Read([]byte) (int, error) { return 0, io.EOF }
func (e errCloser) Close() error           { return e.err }
