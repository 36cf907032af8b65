package egress

import (
	"bufio"
	"compress/gzip"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/policy"
	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// anthropicStandIn is a stand-in for Anthropic's Messages API: POST
// /v1/messages answers with the documented JSON body, or, with "stream":
// true, the documented server-sent events, where message_delta's usage is
// cumulative. Each response reports 10 input tokens, 3 cache-read, 2
// cache-write and 7 output tokens. next, when set, holds the stream after
// its first event until it is closed (or a value arrives).
type anthropicStandIn struct {
	next chan struct{}
	// keys are the x-api-key values the stand-in received.
	mu   sync.Mutex
	keys []string
	gzip bool
}

func (a *anthropicStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.keys = append(a.keys, r.Header.Get("x-api-key"))
	a.mu.Unlock()
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	if !req.Stream {
		body := fmt.Sprintf(`{"id":"msg_1","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":10,"cache_read_input_tokens":3,"cache_creation_input_tokens":2,"output_tokens":7}}`, req.Model)
		w.Header().Set("Content-Type", "application/json")
		if a.gzip && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			_, _ = io.WriteString(zw, body)
			_ = zw.Close()
			return
		}
		_, _ = io.WriteString(w, body)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	f := w.(http.Flusher)
	send := func(event, data string) {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, data)
		f.Flush()
	}
	send("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","model":%q,"content":[],"usage":{"input_tokens":10,"cache_read_input_tokens":3,"cache_creation_input_tokens":2,"output_tokens":1}}}`, req.Model))
	if a.next != nil {
		<-a.next
	}
	send("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
	send("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}`)
	send("message_delta", `{"type":"message_delta","delta":{"stop_reason":null},"usage":{"output_tokens":4}}`)
	send("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":7}}`)
	send("message_stop", `{"type":"message_stop"}`)
}

// meterBundle is a session injecting a key for the stand-in, reached as
// example.com (the name of httptest's certificate), and a client of the
// run trusting the session's CA.
type meterBundle struct {
	*bundle
	url    string
	client *http.Client
	mu     sync.Mutex
	usage  []messages.UsageEvent
	budget []Budget
}

func meterSetup(t *testing.T, h http.Handler, m Metering, mods ...func(*Config)) *meterBundle {
	t.Helper()
	return meterSetupCarried(t, h, m, nil, mods...)
}

// meterSetupCarried is meterSetup for a session that goes on from c (nil:
// a fresh one), carried before it serves.
func meterSetupCarried(t *testing.T, h http.Handler, m Metering, c *Carried, mods ...func(*Config)) *meterBundle {
	t.Helper()
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	p := port(t, srv.URL)
	ca, caPEM, err := LoadOrCreateCA(t.TempDir(), "test CA")
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	mb := &meterBundle{bundle: &bundle{path: filepath.Join(t.TempDir(), "egress.sock")}, url: "https://example.com:" + p}
	cfg := Config{Resolver: table{"example.com": {netip.MustParseAddr("127.0.0.1")}}, CA: ca, UpstreamRoots: roots,
		Publish: func(ev messages.EgressEvent) {
			mb.bundle.mu.Lock()
			mb.bundle.events = append(mb.bundle.events, ev)
			mb.bundle.mu.Unlock()
		}}
	for _, mod := range mods {
		mod(&cfg)
	}
	sess, err := New(cfg,
		"run1", policy.Must("example.com:"+p, "127.0.0.1:"+p), mb.path,
		Injection{Name: "example.com", Port: atoi(t, p), Header: "x-api-key", Value: "sk-secret"})
	require.NoError(t, err)
	t.Cleanup(func() { sess.Close() })
	mb.sess = sess
	if c != nil {
		sess.Carry(*c)
	}
	m.Publish = func(ev messages.UsageEvent) {
		mb.mu.Lock()
		mb.usage = append(mb.usage, ev)
		mb.mu.Unlock()
	}
	m.Reached = func(b Budget) {
		mb.mu.Lock()
		mb.budget = append(mb.budget, b)
		mb.mu.Unlock()
	}
	sess.Meter(m)
	require.NoError(t, sess.Serve())
	mb.client = mb.bundle.client()
	trust := x509.NewCertPool()
	require.True(t, trust.AppendCertsFromPEM(caPEM))
	mb.client.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: trust}
	mb.client.Timeout = 10 * time.Second
	return mb
}

// post sends a Messages request of model, streamed or not, and returns
// the response (its body unread).
func (mb *meterBundle) post(t *testing.T, model string, stream bool) *http.Response {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"max_tokens":64,"stream":%t,"messages":[{"role":"user","content":"hi"}]}`, model, stream)
	req, err := http.NewRequest(http.MethodPost, mb.url+"/v1/messages", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-api-key", "the-agent's-own-key")
	resp, err := mb.client.Do(req)
	require.NoError(t, err)
	return resp
}

func (mb *meterBundle) events() []messages.UsageEvent {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	return append([]messages.UsageEvent(nil), mb.usage...)
}

func (mb *meterBundle) waitEvents(t *testing.T, n int) []messages.UsageEvent {
	t.Helper()
	require.Eventually(t, func() bool { return len(mb.events()) >= n }, 5*time.Second, 5*time.Millisecond, "usage events")
	return mb.events()
}

// A model request to an injected host is metered, streamed or not: one
// usage event per response with the tokens the provider reported (the
// stream's cumulative message_delta counted once), the cost by the price
// table (the dated model matched by its prefix), the run's totals; the
// provider gets the injected key, never the agent's.
func TestMeterAnthropic(t *testing.T) {
	t.Parallel()
	h := &anthropicStandIn{}
	prices, err := usage.ParsePrices("prices.toml", []byte(`
[models."claude-test-4"]
input = 3.0
output = 15.0
cache_read = 0.3
cache_write = 3.75
`))
	require.NoError(t, err)
	mb := meterSetup(t, h, Metering{Prices: prices})

	resp := mb.post(t, "claude-test-4-20250101", false)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	require.Contains(t, string(b), `"output_tokens":7`, "the body passes unchanged")

	resp = mb.post(t, "claude-test-4-20250101", true)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(b), "event: message_stop")

	evs := mb.waitEvents(t, 2)
	want := messages.Tokens{Input: 10, Output: 7, CacheRead: 3, CacheWrite: 2}
	cost := (10*3.0 + 7*15.0 + 3*0.3 + 2*3.75) / 1e6
	for i, ev := range evs {
		require.True(t, ev.Known, "event %d: %+v", i, ev)
		require.Equal(t, "run1", ev.RunID)
		require.Equal(t, messages.FormatAnthropic, ev.Format)
		require.Equal(t, "example.com", ev.Host)
		require.Equal(t, "claude-test-4-20250101", ev.Model)
		require.Equal(t, http.StatusOK, ev.Status)
		require.Equal(t, i == 1, ev.Stream)
		require.Equal(t, want, ev.Tokens)
		require.NotNil(t, ev.CostUSD)
		require.InDelta(t, cost, *ev.CostUSD, 1e-12)
	}
	tot := mb.sess.Usage()
	require.EqualValues(t, 2, tot.Requests)
	require.Equal(t, want.Add(want), tot.Tokens)
	require.InDelta(t, 2*cost, tot.CostUSD, 1e-12)
	h.mu.Lock()
	require.Equal(t, []string{"sk-secret", "sk-secret"}, h.keys)
	h.mu.Unlock()
}

// A stream is not held back: each server-sent event reaches the run as
// soon as the provider sent it (the stand-in sends its second event only
// after the run has read the first), and the metering still reads its
// usage at the end.
func TestMeterStreamNotBuffered(t *testing.T) {
	t.Parallel()
	h := &anthropicStandIn{next: make(chan struct{})}
	mb := meterSetup(t, h, Metering{})
	resp := mb.post(t, "claude-test-4", true)
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	got := make(chan string, 1)
	go func() {
		line, _ := r.ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		require.Equal(t, "event: message_start\n", line)
	case <-time.After(5 * time.Second):
		close(h.next)
		t.Fatal("the first event did not reach the run before the provider sent the next")
	}
	close(h.next)
	_, _ = io.ReadAll(r)
	evs := mb.waitEvents(t, 1)
	require.True(t, evs[0].Known)
	require.EqualValues(t, 7, evs[0].Tokens.Output)
	require.Nil(t, evs[0].CostUSD, "no price table: tokens only")
}

// A response the run asked to be gzipped is still metered: the proxy asks
// for it in clear (Go's transport decompresses), and the run gets it in
// clear.
func TestMeterCompressedResponse(t *testing.T) {
	t.Parallel()
	mb := meterSetup(t, &anthropicStandIn{gzip: true}, Metering{})
	body := `{"model":"claude-test-4","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
	req, err := http.NewRequest(http.MethodPost, mb.url+"/v1/messages", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Accept-Encoding", "gzip") // set by hand: Go's client then does not decompress
	resp, err := mb.client.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(b), `"output_tokens":7`)
	evs := mb.waitEvents(t, 1)
	require.True(t, evs[0].Known, "%+v", evs[0])
	require.EqualValues(t, 10, evs[0].Tokens.Input)
}

// Budgets: a request past max_model_requests is answered by the proxy with
// Anthropic's own rate-limit error shape (429, type rate_limit_error), never
// reaches the provider, and tells the run's budget once; so is one whose
// worst case does not fit what is left of max_output_tokens or
// max_cost_usd beside what the run spent.
func TestMeterBudgets(t *testing.T) {
	t.Parallel()
	prices, err := usage.ParsePrices("p.toml", []byte("[models.\"claude-test-4\"]\ninput = 1000\noutput = 1000\n"))
	require.NoError(t, err)
	for _, c := range []struct {
		name    string
		limits  Limits
		allowed int
		key     string
		spent   float64
	}{
		{"requests", Limits{MaxRequests: 2}, 2, "max_model_requests", 2},
		// Each request may generate 64 tokens (its max_tokens) and
		// generates 7: the third's 64 do not fit beside 14.
		{"output", Limits{MaxOutputTokens: 71}, 2, "max_output_tokens", 14},
		// Each may cost 0.097 (64 output tokens and 33 estimated input
		// ones at 1000 USD a million) and costs 0.017: the second does
		// not fit beside it.
		{"cost", Limits{MaxCostUSD: 0.1}, 1, "max_cost_usd", 0.017},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := &anthropicStandIn{}
			mb := meterSetup(t, h, Metering{Prices: prices, Limits: c.limits})
			for range c.allowed {
				resp := mb.post(t, "claude-test-4", false)
				_, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
				require.Equal(t, http.StatusOK, resp.StatusCode)
			}
			mb.waitEvents(t, c.allowed)
			for range 2 {
				resp := mb.post(t, "claude-test-4", false)
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
				require.Equal(t, "false", resp.Header.Get("X-Should-Retry"), "the SDKs do not retry it")
				var e struct {
					Type  string `json:"type"`
					Error struct {
						Type    string `json:"type"`
						Message string `json:"message"`
					} `json:"error"`
				}
				require.NoError(t, json.Unmarshal(b, &e), string(b))
				require.Equal(t, "error", e.Type)
				require.Equal(t, "rate_limit_error", e.Error.Type)
				require.Contains(t, e.Error.Message, c.key)
			}
			h.mu.Lock()
			require.Len(t, h.keys, c.allowed, "a refused request never reaches the provider")
			h.mu.Unlock()
			mb.mu.Lock()
			require.Len(t, mb.budget, 1, "told once")
			require.Equal(t, c.key, mb.budget[0].Key)
			require.InDelta(t, c.spent, mb.budget[0].Spent, 1e-9)
			mb.mu.Unlock()
			b, ok := mb.sess.Reached()
			require.True(t, ok)
			require.Contains(t, b.String(), c.key)
			tot := mb.sess.Usage()
			require.EqualValues(t, c.allowed, tot.Requests)
			require.EqualValues(t, 2, tot.Refused)
			var refused int
			for _, ev := range mb.recorded() {
				if !ev.Allowed && strings.Contains(ev.Reason, c.key) {
					refused++
				}
			}
			require.Equal(t, 2, refused, "each refusal is an egress event naming the budget")
		})
	}
}

// A request the proxy cannot read (another path, a body that is not JSON,
// an error answer) is counted as a model request with unknown usage and
// passes unchanged; never an error for the run.
func TestMeterUnknownUsage(t *testing.T) {
	t.Parallel()
	mb := meterSetup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/messages" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"type":"error","error":{"type":"api_error","message":"boom"}}`)
			return
		}
		_, _ = io.WriteString(w, "plain")
	}), Metering{})
	resp, err := mb.client.Get(mb.url + "/v1/models")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, "plain", string(b))
	resp = mb.post(t, "claude-test-4", false)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	require.Contains(t, string(b), "boom")
	evs := mb.waitEvents(t, 2)
	for _, ev := range evs {
		require.False(t, ev.Known, "%+v", ev)
	}
	require.Equal(t, "", evs[0].Format)
	require.Equal(t, "claude-test-4", evs[1].Model, "the model from the request")
	tot := mb.sess.Usage()
	require.EqualValues(t, 2, tot.Requests)
	require.EqualValues(t, 2, tot.Unknown)
}

// The metered host cannot be reached past the metering: another listed
// name for its address and port, or the address itself when listed, is
// refused (a run with a key of its own would otherwise spend unmetered).
func TestMeterOtherNameRefused(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(&anthropicStandIn{})
	t.Cleanup(srv.Close)
	p := port(t, srv.URL)
	ca, _, err := LoadOrCreateCA(t.TempDir(), "test CA")
	require.NoError(t, err)
	b := &bundle{path: filepath.Join(t.TempDir(), "egress.sock")}
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	sess, err := Open(Config{Resolver: table{"example.com": lo, "alias.example": lo}, CA: ca,
		Publish: func(ev messages.EgressEvent) { b.mu.Lock(); b.events = append(b.events, ev); b.mu.Unlock() }},
		"run1", policy.Must("example.com:"+p, "alias.example:"+p, "127.0.0.1:"+p), b.path,
		Injection{Name: "example.com", Port: atoi(t, p), Header: "x-api-key", Value: "sk-secret"})
	require.NoError(t, err)
	t.Cleanup(func() { sess.Close() })
	b.sess = sess
	c := b.client()
	for _, host := range []string{"alias.example", "127.0.0.1"} {
		_, err := c.Post("https://"+host+":"+p+"/v1/messages", "application/json", strings.NewReader(`{"model":"m"}`))
		require.Error(t, err, "%s: the tunnel is refused", host)
	}
	var reasons []string
	for _, ev := range b.recorded() {
		require.False(t, ev.Allowed, "%+v", ev)
		reasons = append(reasons, ev.Reason)
	}
	require.Len(t, reasons, 2)
	for _, r := range reasons {
		require.Contains(t, r, "a host the proxy meters")
	}
	require.Zero(t, sess.Usage().Requests)
}

// The metering's memory is bounded by MaxMetered: a model request past it
// waits for a metered one to end (it never goes unmetered), then goes.
func TestMeterSlotsBounded(t *testing.T) {
	t.Parallel()
	var served atomic.Int32
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		<-release
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"model":"m","usage":{"input_tokens":1,"output_tokens":2}}`)
	})
	mb := meterSetup(t, h, Metering{}, func(c *Config) { c.MaxMetered = 1 })
	codes := make(chan int, 2)
	for range 2 {
		go func() {
			resp := mb.post(t, "m", false)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	require.Eventually(t, func() bool { return served.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	require.EqualValues(t, 1, served.Load(), "the second request waits for the slot")
	close(release)
	require.Equal(t, http.StatusOK, <-codes)
	require.Equal(t, http.StatusOK, <-codes)
	require.EqualValues(t, 2, served.Load())
	evs := mb.waitEvents(t, 2)
	require.True(t, evs[0].Known && evs[1].Known, "both metered")
}

// Usage events are capped by MaxEvents per run; past it the totals still
// count every response.
func TestMeterEventsCapped(t *testing.T) {
	t.Parallel()
	mb := meterSetup(t, &anthropicStandIn{}, Metering{}, func(c *Config) { c.MaxEvents = 1 })
	for range 3 {
		resp := mb.post(t, "claude-test-4", false)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	require.Eventually(t, func() bool { return mb.sess.Usage().Requests == 3 }, 5*time.Second, 5*time.Millisecond)
	require.Len(t, mb.events(), 1)
	require.EqualValues(t, 21, mb.sess.Usage().Tokens.Output)
}
