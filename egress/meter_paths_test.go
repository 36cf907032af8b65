package egress

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/policy"
	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// anyStandIn answers every request 200 with a small JSON body and counts
// the requests it received, by method and path.
type anyStandIn struct {
	mu   sync.Mutex
	seen []string
}

func (a *anyStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	a.mu.Lock()
	a.seen = append(a.seen, r.Method+" "+r.URL.Path)
	a.mu.Unlock()
	if r.Header.Get("Upgrade") != "" {
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "websocket")
		w.WriteHeader(http.StatusSwitchingProtocols)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"model":"gpt-4o","usage":{"prompt_tokens":1,"completion_tokens":1}}`)
}

func (a *anyStandIn) received() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.seen...)
}

// send sends method path with body and headers (key, value pairs) and
// returns the answer's status, body and headers.
func (mb *meterBundle) send(t *testing.T, method, path, body string, hdr ...string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, mb.url+path, strings.NewReader(body))
	require.NoError(t, err)
	if body == "" {
		req.Body = nil
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := mb.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

var pathPrices = mustPrices(`[models."gpt-4o"]
input = 2.5
output = 10
`)

func mustPrices(toml string) *usage.Prices {
	p, err := usage.ParsePrices("prices.toml", []byte(toml))
	if err != nil {
		panic(err)
	}
	return p
}

// While a run has a cost or token budget, a request on a metered host
// whose usage the proxy cannot read is refused before it is sent, with the
// provider's own error shape (403, which the SDKs do not retry) naming
// the path: another path, a background Responses request and the later
// GET of one, a body over the bound or not JSON; a path the profile lists
// (egress_unmetered_paths) passes, and so do the providers' documented
// free endpoints (model lists, token counting). Without a cost or token
// budget everything passes, as unknown usage. A WebSocket upgrade is
// refused on a metered host, budget or not, unless listed.
func TestMeterUnreadableRefusedUnderBudget(t *testing.T) {
	t.Parallel()
	listed, err := policy.ParseUnmeteredPaths([]string{"POST /v1/embeddings", "/v1/files/*"})
	require.NoError(t, err)
	big := `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("x", maxMeteredRequest) + `"}]}`
	refused := []struct{ name, method, path, body, want string }{
		{"completions", "POST", "/v1/completions", `{"model":"gpt-4o","prompt":"hi"}`, "POST /v1/completions"},
		{"images", "POST", "/v1/images/generations", `{"prompt":"a cat"}`, "POST /v1/images/generations"},
		{"batches", "POST", "/v1/batches", `{"input_file_id":"f"}`, "POST /v1/batches"},
		{"realtime", "POST", "/v1/realtime/sessions", `{}`, "POST /v1/realtime/sessions"},
		{"background", "POST", "/v1/responses", `{"model":"gpt-4o","background":true,"input":"hi"}`, `"background": true`},
		{"background GET", "GET", "/v1/responses/resp_123", "", "GET /v1/responses/resp_123"},
		{"not json", "POST", "/v1/chat/completions", `model=gpt-4o`, "POST /v1/chat/completions"},
		{"too big", "POST", "/v1/chat/completions", big, "over 4 MiB"},
		{"unclean listed", "POST", "/v1/files/../completions", `{"model":"gpt-4o"}`, "POST /v1/files/../completions"},
	}
	passed := []struct{ name, method, path, body string }{
		{"listed", "POST", "/v1/embeddings", `{"input":"x"}`},
		{"listed prefix", "GET", "/v1/files/file_1/content", ""},
		{"model list", "GET", "/v1/models", ""},
		{"count tokens", "POST", "/v1/messages/count_tokens", `{"model":"gpt-4o"}`},
		{"vertex count tokens", "POST", "/v1/projects/p/locations/us-east5/publishers/anthropic/models/count-tokens:rawPredict", `{"model":"claude-sonnet-4-5"}`},
		{"code assist count tokens", "POST", "/v1internal:countTokens", `{"request":{"model":"models/gemini-2.5-pro"}}`},
		{"metered", "POST", "/v1/chat/completions", `{"model":"gpt-4o","max_tokens":10}`},
	}
	for _, c := range []struct {
		name   string
		limits Limits
		strict bool
	}{
		{"cost", Limits{MaxCostUSD: 100}, true},
		{"tokens", Limits{MaxOutputTokens: 1 << 40}, true},
		{"requests only", Limits{MaxRequests: 100}, false},
		{"none", Limits{}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := &anyStandIn{}
			mb := meterSetup(t, h, Metering{Prices: pathPrices, Limits: c.limits, Unmetered: listed})
			for _, r := range refused {
				status, body, hdr := mb.send(t, r.method, r.path, r.body, "Content-Type", "application/json")
				if !c.strict {
					require.Equal(t, http.StatusOK, status, "%s: %s", r.name, body)
					continue
				}
				require.Equal(t, http.StatusForbidden, status, "%s: %s", r.name, body)
				require.Equal(t, "false", hdr.Get("X-Should-Retry"))
				var e struct {
					Error struct {
						Message string `json:"message"`
						Type    string `json:"type"`
					} `json:"error"`
				}
				require.NoError(t, json.Unmarshal([]byte(body), &e), "%s: %s", r.name, body)
				require.Equal(t, "invalid_request_error", e.Error.Type, r.name)
				require.Contains(t, e.Error.Message, r.want, r.name)
				require.Contains(t, e.Error.Message, "egress_unmetered_paths", r.name)
			}
			for _, p := range passed {
				status, body, _ := mb.send(t, p.method, p.path, p.body, "Content-Type", "application/json")
				require.Equal(t, http.StatusOK, status, "%s: %s", p.name, body)
			}
			for _, s := range h.received() {
				if c.strict {
					require.NotContains(t, []string{"POST /v1/completions", "POST /v1/images/generations", "POST /v1/batches", "GET /v1/responses/resp_123"}, s, "refused, yet sent")
				}
			}
			status, body, _ := mb.send(t, "GET", "/v1/realtime?model=gpt-4o", "", "Upgrade", "websocket", "Connection", "Upgrade")
			require.Equal(t, http.StatusForbidden, status, body)
			require.Contains(t, body, "Upgrade")
			require.NotContains(t, h.received(), "GET /v1/realtime", "an upgrade never reaches the provider")
			tot := mb.sess.Usage()
			if c.strict {
				require.EqualValues(t, len(refused)+1, tot.Refused)
			}
			// What passes unmetered holds no reservation and is not
			// charged one: it is a request with unknown usage.
			require.Zero(t, tot.Estimated, "%+v", tot)
			require.Zero(t, tot.Unpriced, "%+v", tot)
			_, reached := mb.sess.Reached()
			require.False(t, reached, "a refused path is no budget reached: the run goes on")
			var reasons int
			for _, ev := range mb.recorded() {
				if !ev.Allowed && strings.Contains(ev.Reason, "egress_unmetered_paths") {
					reasons++
				}
			}
			if c.strict {
				require.Equal(t, len(refused)+1, reasons, "each refusal is an egress event with its reason")
			}
		})
	}
}

// A refusal's error shape follows the provider the request was for:
// Anthropic's for a request with anthropic-version, Google's for a Gemini
// path, OpenAI's otherwise.
func TestMeterRefusalShapes(t *testing.T) {
	t.Parallel()
	mb := meterSetup(t, &anyStandIn{}, Metering{Limits: Limits{MaxOutputTokens: 100}})
	status, body, _ := mb.send(t, "POST", "/v1/messages/batches", `{}`, "anthropic-version", "2023-06-01")
	require.Equal(t, http.StatusForbidden, status)
	require.Contains(t, body, `"type":"error"`)
	require.Contains(t, body, `"permission_error"`)
	status, body, _ = mb.send(t, "POST", "/v1beta/cachedContents", `{}`, "x-goog-api-client", "genai-js")
	require.Equal(t, http.StatusForbidden, status)
	require.Contains(t, body, `"PERMISSION_DENIED"`)
	status, body, _ = mb.send(t, "POST", "/v1beta/models/gemini-2.5-pro:embedContent", `{}`)
	require.Equal(t, http.StatusForbidden, status)
	require.Contains(t, body, `"PERMISSION_DENIED"`)
	// Gemini CLI's Code Assist endpoint gets Google's shape too (here a
	// body that is not JSON, whose cost cannot be known).
	status, body, _ = mb.send(t, "POST", "/v1internal:generateContent", `not json`)
	require.Equal(t, http.StatusForbidden, status)
	require.JSONEq(t, `{"error":{"code":403,"status":"PERMISSION_DENIED","message":`+quoteJSON(t, extractMessage(t, body))+`}}`, body)
	require.Equal(t, messages.FormatGemini, refusalFormat(httpReq("POST", "/v1beta/tunedModels")))
}

// extractMessage returns the error.message of a Google-shaped error body.
func extractMessage(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error struct{ Message string } `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	require.NotEmpty(t, e.Error.Message, body)
	return e.Error.Message
}

// quoteJSON returns s as a JSON string.
func quoteJSON(t *testing.T, s string) string {
	t.Helper()
	b, err := json.Marshal(s)
	require.NoError(t, err)
	return string(b)
}

func httpReq(method, path string) *http.Request {
	r, _ := http.NewRequest(method, "https://example.com"+path, nil)
	return r
}

// Under a cost budget (the run's own or a shared one) a request naming a
// model the price table has no price for, or naming none, is refused
// before it is sent, with a reason naming the model (and so is every
// request when the worker has no price table); under a token budget alone
// it passes. A response whose model differs from the request's and has no
// price is priced as the request's model, which the proxy admitted.
func TestMeterUnpricedModelRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		prices *usage.Prices
		m      Metering
		strict bool
		want   string
	}{
		{"own cost", pathPrices, Metering{Limits: Limits{MaxCostUSD: 10}}, true, `model "gpt-unknown" has no price`},
		{"shared cost", pathPrices, Metering{SharedLimits: Limits{MaxCostUSD: 10}}, true, `model "gpt-unknown" has no price`},
		{"no table", nil, Metering{Limits: Limits{MaxCostUSD: 10}}, true, "no price table"},
		{"tokens only", pathPrices, Metering{Limits: Limits{MaxOutputTokens: 1 << 30}}, false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := &anyStandIn{}
			c.m.Prices = c.prices
			mb := meterSetup(t, h, c.m)
			status, body, _ := mb.send(t, "POST", "/v1/chat/completions", `{"model":"gpt-unknown","max_tokens":10}`)
			if !c.strict {
				require.Equal(t, http.StatusOK, status, body)
				return
			}
			require.Equal(t, http.StatusForbidden, status, body)
			var e struct {
				Error struct{ Message string } `json:"error"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &e))
			require.Contains(t, e.Error.Message, c.want)
			status, body, _ = mb.send(t, "POST", "/v1/chat/completions", `{"max_tokens":10}`)
			require.Equal(t, http.StatusForbidden, status, body)
			require.Empty(t, h.received(), "a refused request never reaches the provider")
			_, reached := mb.sess.Reached()
			require.False(t, reached)
		})
	}

	t.Run("response model", func(t *testing.T) {
		t.Parallel()
		mb := meterSetup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"model":"o-mystery","usage":{"prompt_tokens":1000,"completion_tokens":100}}`)
		}), Metering{Prices: pathPrices, Limits: Limits{MaxCostUSD: 10}})
		status, body, _ := mb.send(t, "POST", "/v1/chat/completions", `{"model":"gpt-4o","max_tokens":100}`)
		require.Equal(t, http.StatusOK, status, body)
		ev := mb.waitEvents(t, 1)[0]
		require.Equal(t, "o-mystery", ev.Model)
		require.NotNil(t, ev.CostUSD, "priced as the request's model")
		require.InDelta(t, (1000*2.5+100*10)/1e6, *ev.CostUSD, 1e-12)
		require.Zero(t, mb.sess.Usage().Unpriced)
	})
}
