package egress

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// chatStandIn is a stand-in for OpenAI's Chat Completions API: it answers
// a stream with the recorded stream of the usage package's testdata, with
// its final usage chunk only when the request asked for it
// (stream_options.include_usage), as OpenAI does; a request that does not
// stream gets the recorded completion. It keeps each request's body and
// whether its Content-Length was the body's length.
type chatStandIn struct {
	t  *testing.T
	mu sync.Mutex
	// bodies are the request bodies received; lengthOK whether each
	// one's Content-Length matched it.
	bodies   [][]byte
	lengthOK []bool
}

func (c *chatStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	c.mu.Lock()
	c.bodies = append(c.bodies, body)
	c.lengthOK = append(c.lengthOK, r.ContentLength == int64(len(body)) && r.Header.Get("Content-Length") == strconv.Itoa(len(body)))
	c.mu.Unlock()
	var req struct {
		Stream        bool `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	_ = json.Unmarshal(body, &req)
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(chatFixture(c.t, "openai-chat-completion.json"))
		return
	}
	name := "openai-chat-stream-nousage.sse"
	if req.StreamOptions.IncludeUsage {
		name = "openai-chat-stream-usage.sse"
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for ev := range bytes.SplitAfterSeq(chatFixture(c.t, name), []byte("\n\n")) {
		_, _ = w.Write(ev)
		w.(http.Flusher).Flush()
	}
}

// received returns the request bodies the stand-in got.
func (c *chatStandIn) received() ([][]byte, []bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]byte(nil), c.bodies...), append([]bool(nil), c.lengthOK...)
}

// chatFixture reads a recorded answer of the usage package's testdata.
func chatFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("usage/testdata/" + name)
	require.NoError(t, err)
	return b
}

// usageChunk is the recorded stream's usage chunk (the event before
// [DONE]), as the provider sends it.
func usageChunk(t *testing.T) []byte {
	t.Helper()
	evs := bytes.SplitAfter(chatFixture(t, "openai-chat-stream-usage.sse"), []byte("\n\n"))
	for _, ev := range evs {
		if bytes.Contains(ev, []byte(`"choices":[],"usage":{`)) {
			return ev
		}
	}
	t.Fatal("no usage chunk in the recorded stream")
	return nil
}

// chatBody is a Chat Completions request body.
func chatBody(stream bool, extra string) string {
	return `{"model":"gpt-4o","messages":[{"role":"user","content":"hi <b>&</b>"}],"stream":` + strconv.FormatBool(stream) + extra + `}`
}

// postChat posts body to the stand-in's chat path and returns the answer's
// status and body.
func (mb *meterBundle) postChat(t *testing.T, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, mb.url+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := mb.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

// A chat stream whose client did not ask for usage is sent upstream with
// stream_options.include_usage = true (its Content-Length the new body's),
// so the proxy reads its usage; the usage chunk that adds is taken out of
// what the client receives, which is byte for byte the provider's stream
// without it. The openai-go SDK, as a real client, sees no usage, as it
// asked; a client that asked for usage gets its chunk, and its request
// goes upstream unchanged.
func TestMeterChatStreamAsksForUsage(t *testing.T) {
	t.Parallel()
	h := &chatStandIn{t: t}
	mb := meterSetup(t, h, Metering{})
	want := messages.Tokens{Input: 2006 - 1920, Output: 300, CacheRead: 1920}

	t.Run("bytes", func(t *testing.T) {
		status, got := mb.postChat(t, chatBody(true, ""))
		require.Equal(t, http.StatusOK, status)
		upstream := chatFixture(t, "openai-chat-stream-usage.sse")
		require.Equal(t, string(bytes.Replace(upstream, usageChunk(t), nil, 1)), string(got),
			"the client gets the provider's stream less the usage chunk")
		bodies, lengthOK := h.received()
		require.Len(t, bodies, 1)
		require.True(t, lengthOK[0], "Content-Length is the rewritten body's")
		var up map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(bodies[0], &up), string(bodies[0]))
		require.JSONEq(t, `{"include_usage":true}`, string(up["stream_options"]))
		require.JSONEq(t, `"gpt-4o"`, string(up["model"]))
		require.JSONEq(t, `[{"role":"user","content":"hi <b>&</b>"}]`, string(up["messages"]))
		evs := mb.waitEvents(t, 1)
		require.True(t, evs[0].Known, "%+v", evs[0])
		require.Equal(t, want, evs[0].Tokens)
	})

	t.Run("asked", func(t *testing.T) {
		body := chatBody(true, `,"stream_options":{"include_usage":true}`)
		status, got := mb.postChat(t, body)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, string(chatFixture(t, "openai-chat-stream-usage.sse")), string(got), "the usage it asked for")
		bodies, _ := h.received()
		require.Equal(t, body, string(bodies[len(bodies)-1]), "a request that asks for usage goes unchanged")
	})

	t.Run("sdk", func(t *testing.T) {
		client := openai.NewClient(option.WithBaseURL(mb.url+"/v1"), option.WithAPIKey("x"), option.WithMaxRetries(0),
			option.WithHTTPClient(mb.client))
		stream := client.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
			Model: openai.ChatModelGPT4o, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for stream.Next() {
			c := stream.Current()
			require.NotContains(t, c.RawJSON(), `"usage":{`, "a usage chunk reached the client")
			acc.AddChunk(c)
			chunks++
		}
		require.NoError(t, stream.Err())
		require.Equal(t, 4, chunks, "the recorded stream's four chunks, no more")
		require.Zero(t, acc.Usage.PromptTokens, "the client sees the stream it asked for")
		require.Equal(t, "Hello!", acc.Choices[0].Message.Content)
		evs := mb.waitEvents(t, 3)
		require.True(t, evs[2].Known, "%+v", evs[2])
		require.Equal(t, want, evs[2].Tokens)
	})
}
