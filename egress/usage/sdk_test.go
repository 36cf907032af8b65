package usage_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// These tests put the providers' own Go SDKs on the agent's side of a
// stand-in egress proxy (a reverse proxy that meters with ReadRequest and
// Wrap, as the real one does) in front of a stand-in provider serving the
// testdata responses, and check the Result is the usage the SDK read.

// standIn is a stand-in provider behind a metering reverse proxy.
type standIn struct {
	// url is the proxy's: the SDK's base URL.
	url string
	// requests and results receive what the proxy read of each request
	// and response.
	requests chan usage.Request
	results  chan usage.Result
	// upstream counts the requests the provider received.
	upstream atomic.Int32
}

// reply is what the stand-in provider answers.
type reply struct {
	status int
	ct     string
	body   []byte
	header http.Header
	// pause, if not nil, holds the rest of the body after its first
	// event until it is closed or the request ends.
	pause <-chan struct{}
}

// newStandIn starts a provider that answers each request with
// answer(streamRequested), and a metering proxy in front of it.
func newStandIn(t *testing.T, answer func(stream bool) reply) *standIn {
	t.Helper()
	s := &standIn{requests: make(chan usage.Request, 8), results: make(chan usage.Result, 8)}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.upstream.Add(1)
		var req struct {
			Stream bool `json:"stream"`
		}
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &req)
		a := answer(req.Stream)
		for k, v := range a.header {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Type", a.ct)
		w.WriteHeader(a.status)
		// A stream goes out event by event, as a provider sends it.
		first := true
		for ev := range bytes.SplitAfterSeq(a.body, []byte("\n\n")) {
			_, _ = w.Write(ev)
			w.(http.Flusher).Flush()
			if first && a.pause != nil {
				select {
				case <-a.pause:
				case <-r.Context().Done():
					return
				}
			}
			first = false
		}
	}))
	t.Cleanup(up.Close)
	target, err := url.Parse(up.URL)
	require.NoError(t, err)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		format := usage.Detect(r.Method, r.URL.Path)
		info, body := requestInfo(format, r.URL.Path, r.Body, 1<<20)
		r.Body = body
		s.requests <- info
		rp := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
			ModifyResponse: func(resp *http.Response) error {
				resp.Body = usage.Wrap(format, info, resp.StatusCode, resp.Header.Get("Content-Type"), resp.Body, 1<<20,
					func(res usage.Result) { s.results <- res })
				return nil
			},
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	s.url = proxy.URL
	return s
}

// serve answers with fixture file, streamed or not.
func serve(t *testing.T, jsonFile, sseFile string) func(bool) reply {
	return func(stream bool) reply {
		if stream {
			return reply{status: 200, ct: "text/event-stream", body: fixture(t, sseFile)}
		}
		return reply{status: 200, ct: "application/json", body: fixture(t, jsonFile)}
	}
}

// result returns the proxy's next Result.
func (s *standIn) result(t *testing.T) usage.Result {
	t.Helper()
	select {
	case r := <-s.results:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no Result from the proxy")
		return usage.Result{}
	}
}

// request returns what the proxy read of the next request.
func (s *standIn) request(t *testing.T) usage.Request {
	t.Helper()
	select {
	case r := <-s.requests:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no request at the proxy")
		return usage.Request{}
	}
}

// anthropicResult is the Result an Anthropic SDK Message says.
func anthropicResult(m anthropic.Message, stream bool) usage.Result {
	u := m.Usage
	return usage.Result{Model: string(m.Model), Known: true, Stream: stream, WebSearches: u.ServerToolUse.WebSearchRequests,
		Tokens: messages.Tokens{Input: u.InputTokens, Output: u.OutputTokens, CacheRead: u.CacheReadInputTokens,
			CacheWrite: u.CacheCreationInputTokens, CacheWrite1h: u.CacheCreation.Ephemeral1hInputTokens}}
}

func anthropicClient(s *standIn, opts ...aoption.RequestOption) anthropic.Client {
	return anthropic.NewClient(append([]aoption.RequestOption{aoption.WithBaseURL(s.url), aoption.WithAPIKey("x"), aoption.WithMaxRetries(0)}, opts...)...)
}

var anthropicParams = anthropic.MessageNewParams{
	Model:     anthropic.ModelClaudeSonnet4_5,
	MaxTokens: 1024,
	Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
}

func TestAnthropicSDK(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ jsonFile, sseFile string }{
		{"anthropic-message.json", "anthropic-stream.sse"},
		{"anthropic-message.json", "anthropic-stream-cache.sse"},
		{"anthropic-message-server-tools.json", "anthropic-stream-server-tools.sse"},
	} {
		t.Run(tc.sseFile, func(t *testing.T) {
			t.Parallel()
			s := newStandIn(t, serve(t, tc.jsonFile, tc.sseFile))
			client := anthropicClient(s)
			ctx := t.Context()

			msg, err := client.Messages.New(ctx, anthropicParams)
			require.NoError(t, err)
			require.Equal(t, usage.Request{Format: messages.FormatAnthropic, Model: "claude-sonnet-4-5"}, s.request(t))
			require.Equal(t, anthropicResult(*msg, false), s.result(t))

			stream := client.Messages.NewStreaming(ctx, anthropicParams)
			var acc anthropic.Message
			for stream.Next() {
				require.NoError(t, acc.Accumulate(stream.Current()))
			}
			require.NoError(t, stream.Err())
			require.NoError(t, stream.Close())
			require.NotZero(t, acc.Usage.OutputTokens)
			require.Equal(t, usage.Request{Format: messages.FormatAnthropic, Model: "claude-sonnet-4-5", Stream: true}, s.request(t))
			require.Equal(t, anthropicResult(acc, true), s.result(t))
		})
	}
}

// chatTokens is what an OpenAI SDK CompletionUsage counts: prompt_tokens
// includes the cached and the cache-written tokens.
func chatTokens(u openai.CompletionUsage) messages.Tokens {
	cached, written := u.PromptTokensDetails.CachedTokens, u.PromptTokensDetails.CacheWriteTokens
	return messages.Tokens{Input: u.PromptTokens - cached - written, Output: u.CompletionTokens, CacheRead: cached, CacheWrite: written}
}

func openaiClient(s *standIn, opts ...ooption.RequestOption) openai.Client {
	return openai.NewClient(append([]ooption.RequestOption{ooption.WithBaseURL(s.url + "/v1"), ooption.WithAPIKey("x"), ooption.WithMaxRetries(0)}, opts...)...)
}

var chatParams = openai.ChatCompletionNewParams{
	Model:    openai.ChatModelGPT4o,
	Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
}

func TestOpenAIChatSDK(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newStandIn(t, serve(t, "openai-chat-completion.json", "openai-chat-stream-usage.sse"))
	client := openaiClient(s)

	resp, err := client.Chat.Completions.New(ctx, chatParams)
	require.NoError(t, err)
	require.Equal(t, usage.Request{Format: messages.FormatOpenAIChat, Model: "gpt-4o"}, s.request(t))
	require.Equal(t, usage.Result{Model: resp.Model, Tokens: chatTokens(resp.Usage), Known: true}, s.result(t))

	s = newStandIn(t, serve(t, "openai-chat-cache-write.json", ""))
	client = openaiClient(s)
	resp, err = client.Chat.Completions.New(ctx, chatParams)
	require.NoError(t, err)
	require.NotZero(t, resp.Usage.PromptTokensDetails.CacheWriteTokens)
	s.request(t)
	require.Equal(t, usage.Result{Model: resp.Model, Tokens: chatTokens(resp.Usage), Known: true}, s.result(t))

	s = newStandIn(t, serve(t, "openai-chat-completion.json", "openai-chat-stream-usage.sse"))
	client = openaiClient(s)
	params := chatParams
	params.StreamOptions.IncludeUsage = openai.Bool(true)
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	require.NoError(t, stream.Err())
	require.NotZero(t, acc.Usage.PromptTokens)
	require.Equal(t, usage.Request{Format: messages.FormatOpenAIChat, Model: "gpt-4o", Stream: true, IncludeUsage: true}, s.request(t))
	require.Equal(t, usage.Result{Model: acc.Model, Tokens: chatTokens(acc.Usage), Known: true, Stream: true}, s.result(t))
}

// A chat stream the client did not ask usage for has none: the SDK sees
// none either, and the proxy knows beforehand (IncludeUsage false).
func TestOpenAIChatSDKWithoutUsage(t *testing.T) {
	t.Parallel()
	s := newStandIn(t, serve(t, "openai-chat-completion.json", "openai-chat-stream-nousage.sse"))
	client := openaiClient(s)
	stream := client.Chat.Completions.NewStreaming(t.Context(), chatParams)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	require.NoError(t, stream.Err())
	require.Equal(t, openai.CompletionUsage{}.PromptTokens, acc.Usage.PromptTokens)
	require.Zero(t, acc.Usage.CompletionTokens)
	require.Equal(t, usage.Request{Format: messages.FormatOpenAIChat, Model: "gpt-4o", Stream: true}, s.request(t))
	require.Equal(t, usage.Result{Model: acc.Model, Stream: true}, s.result(t))
}

// responsesResult is the Result an OpenAI SDK Response says: input_tokens
// includes the cached and the cache-written tokens; each web_search_call
// output item is a search.
func responsesResult(r *responses.Response, stream bool) usage.Result {
	u := r.Usage
	cached, written := u.InputTokensDetails.CachedTokens, u.InputTokensDetails.CacheWriteTokens
	var searches int64
	for _, item := range r.Output {
		if item.Type == "web_search_call" {
			searches++
		}
	}
	return usage.Result{Model: r.Model, Known: true, Stream: stream, WebSearches: searches,
		Tokens: messages.Tokens{Input: u.InputTokens - cached - written, Output: u.OutputTokens, CacheRead: cached, CacheWrite: written}}
}

func TestOpenAIResponsesSDK(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ jsonFile, sseFile string }{
		{"openai-responses-response.json", "openai-responses-stream.sse"},
		{"openai-responses-incomplete.json", "openai-responses-incomplete.sse"},
		{"openai-responses-failed.json", "openai-responses-failed.sse"},
		{"openai-responses-response.json", "openai-responses-web-search.sse"},
	} {
		t.Run(tc.sseFile, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			s := newStandIn(t, serve(t, tc.jsonFile, tc.sseFile))
			client := openaiClient(s)
			params := responses.ResponseNewParams{Model: "gpt-5-codex", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}}

			resp, err := client.Responses.New(ctx, params)
			require.NoError(t, err)
			require.Equal(t, usage.Request{Format: messages.FormatOpenAIResponses, Model: "gpt-5-codex"}, s.request(t))
			require.Equal(t, responsesResult(resp, false), s.result(t))

			stream := client.Responses.NewStreaming(ctx, params)
			var final *responses.Response
			for stream.Next() {
				ev := stream.Current()
				switch ev.Type {
				case "response.completed", "response.incomplete", "response.failed":
					r := ev.Response
					final = &r
				}
			}
			require.NoError(t, stream.Err())
			require.NotNil(t, final, "no final event")
			require.NotZero(t, final.Usage.OutputTokens)
			require.Equal(t, usage.Request{Format: messages.FormatOpenAIResponses, Model: "gpt-5-codex", Stream: true}, s.request(t))
			require.Equal(t, responsesResult(final, true), s.result(t))
		})
	}
}

// The SDKs read QuotaError's bodies as the providers' own errors, with
// the message; they retry a 429 unless told "x-should-retry: false".
func TestQuotaErrorSDK(t *testing.T) {
	t.Parallel()
	const msg = "jetcrew: budget reached: max_cost_usd 5 (spent 5.01 USD)"
	quota := func(format string, header http.Header) func(bool) reply {
		return func(bool) reply {
			status, ct, body := usage.QuotaError(format, msg)
			return reply{status: status, ct: ct, body: body, header: header}
		}
	}
	noRetry := http.Header{"X-Should-Retry": {"false"}}

	t.Run("anthropic", func(t *testing.T) {
		t.Parallel()
		s := newStandIn(t, quota(messages.FormatAnthropic, noRetry))
		client := anthropicClient(s, aoption.WithMaxRetries(2))
		_, err := client.Messages.New(t.Context(), anthropicParams)
		var apiErr *anthropic.Error
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, 429, apiErr.StatusCode)
		require.Equal(t, msg, apiErr.Message)
		require.EqualValues(t, "rate_limit_error", apiErr.Type())
		require.Equal(t, int32(1), s.upstream.Load(), "x-should-retry: false stops the SDK's retries")
		require.False(t, s.result(t).Known)
	})
	t.Run("anthropic retries without the header", func(t *testing.T) {
		t.Parallel()
		s := newStandIn(t, quota(messages.FormatAnthropic, http.Header{"Retry-After-Ms": {"1"}}))
		client := anthropicClient(s, aoption.WithMaxRetries(1))
		_, err := client.Messages.New(t.Context(), anthropicParams)
		require.Error(t, err)
		require.Equal(t, int32(2), s.upstream.Load())
	})
	for _, format := range []string{messages.FormatOpenAIChat, messages.FormatOpenAIResponses} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			s := newStandIn(t, quota(format, noRetry))
			client := openaiClient(s, ooption.WithMaxRetries(2))
			var err error
			if format == messages.FormatOpenAIChat {
				_, err = client.Chat.Completions.New(t.Context(), chatParams)
			} else {
				_, err = client.Responses.New(t.Context(), responses.ResponseNewParams{Model: "gpt-5-codex"})
			}
			var apiErr *openai.Error
			require.ErrorAs(t, err, &apiErr)
			require.Equal(t, 429, apiErr.StatusCode)
			require.Equal(t, msg, apiErr.Message)
			require.Equal(t, "insufficient_quota", apiErr.Code)
			require.Equal(t, "insufficient_quota", apiErr.Type)
			require.Equal(t, int32(1), s.upstream.Load())
		})
	}
}

// An agent that gives up mid-stream closes the connection: the proxy's
// Result is then the usage read so far (message_start's), once.
func TestAnthropicSDKCancelledStream(t *testing.T) {
	t.Parallel()
	pause := make(chan struct{})
	t.Cleanup(func() { close(pause) })
	s := newStandIn(t, func(bool) reply {
		return reply{status: 200, ct: "text/event-stream", body: fixture(t, "anthropic-stream.sse"), pause: pause}
	})
	ctx, cancel := context.WithCancel(t.Context())
	client := anthropicClient(s)
	stream := client.Messages.NewStreaming(ctx, anthropicParams)
	require.True(t, stream.Next())
	require.EqualValues(t, "message_start", stream.Current().Type)
	cancel()
	for stream.Next() {
	}
	require.ErrorIs(t, stream.Err(), context.Canceled)
	_ = stream.Close()
	require.Equal(t, usage.Result{Model: "claude-sonnet-4-5-20250929", Tokens: messages.Tokens{Input: 25, Output: 1}, Known: true, Stream: true}, s.result(t))
	select {
	case r := <-s.results:
		t.Fatalf("a second Result: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
}
