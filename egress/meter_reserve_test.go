package egress

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// fullUseStandIn answers a Chat Completions request as a provider whose
// model used every output token the request allowed: completion_tokens
// is its max_tokens, prompt_tokens 10. It counts what it served.
type fullUseStandIn struct {
	served atomic.Int64
}

func (f *fullUseStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model     string `json:"model"`
		MaxTokens int64  `json:"max_tokens"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	f.served.Add(1)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"model":%q,"usage":{"prompt_tokens":10,"completion_tokens":%d}}`, req.Model, req.MaxTokens)
}

// reservePrices prices model "m": 1 USD per million input tokens, 10 per
// million output tokens.
var reservePrices = mustPrices(`[models.m]
input = 1.0
output = 10.0
`)

// chatMax is a chat request for model m allowing maxTokens output tokens.
func chatMax(maxTokens int) string {
	return fmt.Sprintf(`{"model":"m","max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, maxTokens)
}

// No overshoot: at 99 % of max_cost_usd, 64 requests sent at once, each
// answered with every output token it allowed, end with the run's cost
// within its budget: each request's worst case is reserved before it is
// sent and settled to its real cost when it ends, and one whose worst case
// does not fit what is left is refused before it is sent.
func TestMeterNoOvershootAt99Percent(t *testing.T) {
	t.Parallel()
	h := &fullUseStandIn{}
	const limit = 1.0
	mb := meterSetup(t, h, Metering{Prices: reservePrices, Limits: Limits{MaxCostUSD: limit}})
	// 99 000 output tokens at 10 USD per million: 0.99 USD.
	status, body, _ := mb.send(t, "POST", "/v1/chat/completions", chatMax(99000))
	require.Equal(t, http.StatusOK, status, body)
	mb.waitEvents(t, 1)
	require.InDelta(t, 0.99001, mb.sess.Usage().CostUSD, 1e-9)

	var wg sync.WaitGroup
	var ok, refused atomic.Int64
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, body, _ := mb.send(t, "POST", "/v1/chat/completions", chatMax(100))
			switch status {
			case http.StatusOK:
				ok.Add(1)
			case http.StatusTooManyRequests:
				refused.Add(1)
				require.Contains(t, body, "max_cost_usd")
			default:
				t.Errorf("status %d: %s", status, body)
			}
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool { return mb.sess.Usage().Requests == 1+ok.Load() }, 5*time.Second, 5*time.Millisecond)
	tot := mb.sess.Usage()
	t.Logf("admitted %d of 64, refused %d; spent %.6f USD of %v", ok.Load(), refused.Load(), tot.CostUSD, limit)
	require.LessOrEqual(t, tot.CostUSD, limit, "overshot the budget")
	require.Positive(t, ok.Load(), "what fits is admitted")
	require.Positive(t, refused.Load())
	require.EqualValues(t, 64, ok.Load()+refused.Load())
	require.EqualValues(t, 1+ok.Load(), h.served.Load(), "a refused request never reaches the provider")
	b, reached := mb.sess.Reached()
	require.True(t, reached)
	require.Contains(t, b.String(), "this request may cost up to")
}

// max_output_tokens reserves the same way: a request whose max_tokens
// does not fit what is left of the budget is refused before it is sent.
func TestMeterTokenBudgetReserves(t *testing.T) {
	t.Parallel()
	h := &fullUseStandIn{}
	mb := meterSetup(t, h, Metering{Limits: Limits{MaxOutputTokens: 1000}})
	for range 2 {
		status, body, _ := mb.send(t, "POST", "/v1/chat/completions", chatMax(400))
		require.Equal(t, http.StatusOK, status, body)
	}
	status, body, _ := mb.send(t, "POST", "/v1/chat/completions", chatMax(400))
	require.Equal(t, http.StatusTooManyRequests, status, body)
	require.Contains(t, body, "max_output_tokens")
	require.EqualValues(t, 2, h.served.Load())
	require.EqualValues(t, 800, mb.sess.Usage().Tokens.Output)
	status, body, _ = mb.send(t, "POST", "/v1/chat/completions", chatMax(200))
	require.Equal(t, http.StatusOK, status, "what still fits goes: %s", body)
	require.EqualValues(t, 1000, mb.sess.Usage().Tokens.Output)
}

// A stream the agent closes after its first event is settled from the
// rest of the stream, which the proxy reads to its end on its own: the
// provider's final output count, not the one the agent had seen.
func TestMeterCutStreamSettledFromTheRest(t *testing.T) {
	t.Parallel()
	h := &anthropicStandIn{next: make(chan struct{})}
	mb := meterSetup(t, h, Metering{Prices: mustPrices("[models.\"claude-test-4\"]\ninput = 3.0\noutput = 15.0\n"),
		Limits: Limits{MaxCostUSD: 10}})
	resp := mb.post(t, "claude-test-4", true)
	buf := make([]byte, 64)
	_, err := resp.Body.Read(buf)
	require.NoError(t, err)
	// Closed before its end, the body closes its connection: the agent
	// is gone before the rest comes.
	resp.Body.Close()
	close(h.next)
	ev := mb.waitEvents(t, 1)[0]
	require.True(t, ev.Known, "%+v", ev)
	require.False(t, ev.Estimated)
	require.Equal(t, messages.Tokens{Input: 10, Output: 7, CacheRead: 3, CacheWrite: 2}, ev.Tokens, "the provider's final count")
}

// A stream the agent closes whose rest does not arrive (the provider's
// connection breaks) is settled at its reservation, its worst case, never
// at what the agent chose to receive; so is an answer that carries no
// usage under a budget.
func TestMeterCutStreamSettledAtReservation(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-test-4\",\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n")
		w.(http.Flusher).Flush()
		<-hold
		panic(http.ErrAbortHandler)
	})
	mb := meterSetup(t, h, Metering{Prices: mustPrices("[models.\"claude-test-4\"]\ninput = 3.0\noutput = 15.0\n"),
		Limits: Limits{MaxCostUSD: 10}})
	resp := mb.post(t, "claude-test-4", true)
	buf := make([]byte, 64)
	_, err := resp.Body.Read(buf)
	require.NoError(t, err)
	resp.Body.Close() // the agent is gone before the connection breaks
	close(hold)
	ev := mb.waitEvents(t, 1)[0]
	require.True(t, ev.Estimated, "%+v", ev)
	require.EqualValues(t, 64, ev.Tokens.Output, "the request's max_tokens")
	require.NotNil(t, ev.CostUSD)
	body := `{"model":"claude-test-4","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	in := (int64(len(body)) + 2) / 3
	require.InDelta(t, (float64(in)*3+64*15)/1e6, *ev.CostUSD, 1e-12, "input estimated at a token per 3 bytes")
	tot := mb.sess.Usage()
	require.InDelta(t, *ev.CostUSD, tot.CostUSD, 1e-12)
	require.EqualValues(t, 1, tot.Estimated)
	require.Zero(t, tot.Unknown)
	require.True(t, strings.HasPrefix(ev.Model, "claude-test-4"))
}

// fakePacer gives or refuses every request, recording what it was asked.
type fakePacer struct {
	mu     sync.Mutex
	wait   time.Duration
	tokens []int64
}

func (f *fakePacer) Take(_ context.Context, host string, tokens int64) (time.Duration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens = append(f.tokens, tokens)
	return f.wait, nil
}

// A request its key's rate cannot take in time is answered with the
// provider's own retryable 429 and retry-after, never sent, and holds
// nothing of the budgets; the pacer is asked for the request's tokens
// (its input estimate and output cap).
func TestMeterPacedRequest(t *testing.T) {
	t.Parallel()
	h := &fullUseStandIn{}
	p := &fakePacer{wait: 1500 * time.Millisecond}
	mb := meterSetup(t, h, Metering{Prices: reservePrices, Limits: Limits{MaxCostUSD: 1}, Pacer: p})
	status, body, hdr := mb.send(t, "POST", "/v1/chat/completions", chatMax(100))
	require.Equal(t, http.StatusTooManyRequests, status, body)
	require.Contains(t, body, `"code":"rate_limit_exceeded"`, "OpenAI's retryable rate limit, not insufficient_quota")
	require.Equal(t, "2", hdr.Get("Retry-After"))
	require.Equal(t, "1500", hdr.Get("Retry-After-Ms"))
	require.Empty(t, hdr.Get("X-Should-Retry"))
	require.Zero(t, h.served.Load())
	_, reached := mb.sess.Reached()
	require.False(t, reached)
	p.mu.Lock()
	p.wait = 0
	p.mu.Unlock()
	status, body, _ = mb.send(t, "POST", "/v1/chat/completions", chatMax(100))
	require.Equal(t, http.StatusOK, status, body)
	in := (int64(len(chatMax(100))) + 2) / 3
	require.Equal(t, []int64{in + 100, in + 100}, p.tokens)
	require.EqualValues(t, 1, mb.sess.Usage().Refused)
}
