package egress

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/elazarl/goproxy"

	"github.com/jetcrew/jetcrew/egress/policy"
	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// Headers on the proxy's own answer to a model request it refused.
const (
	// refusedHeader says why the request was refused.
	refusedHeader = "Jetcrew-Refused"
	// budgetHeader names the budget that was reached, when one was.
	budgetHeader = "Jetcrew-Budget"
)

// begin starts metering req, a request to an injected host, or refuses
// it: then it returns the response to send the run instead. A protocol
// upgrade is refused (unless listed in Metering.Unmetered); while the run
// has a cost or token budget, so is a request whose usage cannot be read
// (unmeteredReason); and a request when the run has reached a budget
// (after holding it, with Metering.Pause, until the budget is raised or
// the pause gives up), with the provider's quota error.
func (mt *meter) begin(req *http.Request, host string) (*metered, *http.Response) {
	cfg := mt.ledger.metering()
	format := usage.Detect(req.Method, req.URL.Path)
	listed := cfg.Unmetered.Match(req)
	if up := req.Header.Get("Upgrade"); up != "" && listed == "" {
		return nil, mt.refuse(req, fmt.Sprintf("a protocol upgrade (Upgrade: %.40q) on a host the proxy meters is refused: "+
			"no usage can be read from what it would carry (the profile's egress_unmetered_paths can list %s %s)", up, req.Method, req.URL.Path))
	}
	// A slot of Config.MaxMetered: the request waits for one (it is not
	// let through unmetered), until the run's connection ends.
	select {
	case mt.slots <- struct{}{}:
	case <-connCtx(req).Done():
		return nil, connEnded(req, "a metering slot")
	}
	m := &metered{ev: messages.UsageEvent{RunID: mt.runID, Time: time.Now().UTC(), Host: host, Format: format}}
	m.req.Format = format
	if req.Body != nil && req.Body != http.NoBody && format != "" {
		m.req, m.bounds, req.Body = usage.ReadRequest(format, req.URL.Path, req.Body, maxMeteredRequest)
	}
	cost, tokens := cfg.strict()
	why := unmeteredReason(req, m, listed, cost || tokens)
	if why == "" && listed == "" && cost {
		why = unpricedReason(m, cfg.Prices)
	}
	if why != "" {
		mt.free()
		return nil, mt.refuse(req, why)
	}
	if format != "" && listed == "" {
		// What passes unmetered (a listed or free request) holds nothing.
		m.plan(cfg.Prices, cost, tokens)
	}
	if resp := mt.pace(req, m, cfg); resp != nil {
		return nil, resp
	}
	if resp := mt.admit(req, m); resp != nil {
		return nil, resp
	}
	// Go's transport then asks for gzip itself and decompresses it, so
	// the proxy reads the usage in clear and the run gets the body in
	// clear; an encoding the run asked for (br, zstd) would hide it.
	req.Header.Del("Accept-Encoding")
	askForUsage(req, m)
	return m, nil
}

// connEnded is the answer (to no one) to req, whose connection ended
// while it waited for what: 503, refused for that reason.
func connEnded(req *http.Request, what string) *http.Response {
	resp := goproxy.NewResponse(req, "text/plain", http.StatusServiceUnavailable, "jetcrew egress: the connection ended while the request waited\n")
	resp.Header.Set(refusedHeader, "the connection ended while the request waited for "+what)
	return resp
}

// refusal is the proxy's answer to req in place of its host's (status,
// contentType and body, in the provider's own error shape), refused for
// why.
func refusal(req *http.Request, why string, status int, contentType string, body []byte) *http.Response {
	resp := goproxy.NewResponse(req, contentType, status, string(body))
	resp.Header.Set(refusedHeader, why)
	return resp
}

// unmeteredReason returns why req, read into m, is refused for its
// usage cannot be read while the run has a cost or token budget (its own
// or a shared one: strict), or "": a request that is not a metered format, a
// Responses request run in the background (answered later, by a GET the
// proxy cannot meter either), a body the proxy did not read whole as JSON
// (past maxMeteredRequest, encoded, or not JSON: its model, output cap
// and, for a chat stream, whether it asks for usage are unknown). A
// request the profile lists (listed), or one of the providers' free
// endpoints (freePath), is never refused here.
func unmeteredReason(req *http.Request, m *metered, listed string, strict bool) string {
	if !strict || listed != "" || freePath(req) {
		return ""
	}
	what := fmt.Sprintf("%s %.200s", req.Method, req.URL.Path)
	var why string
	switch {
	case m.req.Format == "":
		why = what + " is not a model request the proxy meters"
	case m.bounds.Background:
		why = `a background Responses request ("background": true) is answered later, where the proxy cannot read its usage`
	case !m.bounds.Whole:
		why = fmt.Sprintf("the body of %s is over %d MiB, encoded or not JSON, so the proxy cannot read what it may cost", what, maxMeteredRequest>>20)
	default:
		return ""
	}
	return fmt.Sprintf("%s, and the run has a cost or token budget (the profile's egress_unmetered_paths can list %s to let it pass unmetered)", why, what)
}

// unpricedReason returns why m, a model request, is refused for its
// price cannot be known by prices, the run having a cost budget (its own
// or a shared one), or "": a cost budget cannot hold a request it cannot
// price. The price table matches the model as Prices.Cost does; a request
// that names no model, and every request when the worker has no price
// table, is refused too; so is one whose worst case needs a price the
// model's row lacks (usage.Worst.Unpriced: its input or output price, a
// tier's, or web_search for a request with a web search tool).
func unpricedReason(m *metered, prices *usage.Prices) string {
	if m.req.Format == "" {
		return ""
	}
	w := m.worstCase(prices)
	switch {
	case w.Priced && len(w.Unpriced) == 0:
		return ""
	case w.Priced:
		return fmt.Sprintf("model %.128q has no %s price in the worker's price table, which this request may need, and the run has a cost budget (max_cost_usd): add it to the table (--prices)",
			m.req.Model, strings.Join(w.Unpriced, ", "))
	case prices == nil:
		return "the worker has no price table (--prices), so a cost budget (max_cost_usd) cannot price any request"
	case m.req.Model == "":
		return "the request names no model the price table could price, and the run has a cost budget (max_cost_usd)"
	}
	return fmt.Sprintf("model %.128q has no price in the worker's price table, and the run has a cost budget (max_cost_usd): add it to the table (--prices)", m.req.Model)
}

// refuse counts req as refused and returns the proxy's answer to it: a
// 403 in the provider's own error shape (usage.PermissionError), with
// why as its message, which the providers' SDKs do not retry.
func (mt *meter) refuse(req *http.Request, why string) *http.Response {
	mt.ledger.refused()
	status, ct, body := usage.PermissionError(refusalFormat(req), "jetcrew: refused: "+why)
	resp := refusal(req, why, status, ct, body)
	resp.Header.Set("X-Should-Retry", "false")
	return resp
}

// admit holds req, read into m, until the run's budgets admit it
// (reserve), or refuses it: then it returns the answer (the provider's
// quota error for its format).
func (mt *meter) admit(req *http.Request, m *metered) *http.Response {
	for {
		m.ev.Time = time.Now().UTC() // the window a shared budget counts it in
		b := mt.reserve(connCtx(req), m)
		if b == nil {
			return nil
		}
		if connCtx(req).Err() != nil {
			// The run's connection ended while the request waited: it is
			// answered (to no one) without reaching a budget.
			mt.free()
			return connEnded(req, "its budget")
		}
		if pause := mt.ledger.metering().Pause; pause != nil {
			mt.ledger.pause(*b, true)
			ok := pause(connCtx(req), *b)
			mt.ledger.pause(*b, false)
			if ok {
				continue
			}
		}
		mt.free()
		if tell := mt.ledger.reach(b); tell != nil {
			tell()
		}
		status, ct, body := usage.QuotaError(m.req.Format, "jetcrew: "+b.String())
		resp := refusal(req, b.String(), status, ct, body)
		resp.Header.Set(budgetHeader, b.String())
		// The providers' SDKs retry a 429 unless told not to (Anthropic's
		// and OpenAI's read x-should-retry): a retry would only be
		// refused again.
		resp.Header.Set("X-Should-Retry", "false")
		return resp
	}
}

// pace takes req's request and tokens from its key's rate (Metering.Pacer),
// waiting as the pacer does, or answers it with the provider's own 429
// and the time to wait (retry-after) when the wait would be longer: the
// request holds nothing then, and the agent's client waits and tries
// again itself (the proxy never retries for it). Called before the
// budgets hold anything for req (admit), so a request waiting for its
// rate holds no budget. cfg is the session's Metering.
func (mt *meter) pace(req *http.Request, m *metered, cfg Metering) *http.Response {
	if cfg.Pacer == nil {
		return nil
	}
	var tokens int64
	if m.bounds.Whole {
		w := m.worstCase(cfg.Prices)
		tokens = w.Input + w.Output
		if tokens < 0 { // saturated output cap
			tokens = w.Output
		}
	}
	wait, err := cfg.Pacer.Take(connCtx(req), m.ev.Host, tokens)
	if err != nil {
		mt.log.Warn().Err(err).Msg("pace a model request by its key's rate; letting it go")
		return nil
	}
	if wait <= 0 {
		return nil
	}
	mt.ledger.refused()
	mt.free()
	secs := int64((wait + time.Second - 1) / time.Second)
	why := fmt.Sprintf("the key's rate (egress_rate) is spent for now: try again in %ds", secs)
	status, ct, body := usage.RateLimitError(refusalFormat(req), "jetcrew: "+why)
	resp := refusal(req, why, status, ct, body)
	resp.Header.Set("Retry-After", strconv.FormatInt(secs, 10))
	resp.Header.Set("Retry-After-Ms", strconv.FormatInt(wait.Milliseconds(), 10))
	return resp
}

// refusalFormat returns the format whose error shape answers req: its
// metered format, else Anthropic's for a request with anthropic-version
// (every Anthropic client sends it), Gemini's for a Google path
// (/v1beta/, a ":method") or client header, else OpenAI's.
func refusalFormat(req *http.Request) string {
	if f := usage.Detect(req.Method, req.URL.Path); f != "" {
		return f
	}
	p := req.URL.Path
	switch {
	case req.Header.Get("Anthropic-Version") != "":
		return messages.FormatAnthropic
	case strings.Contains(p, "/v1beta/") || strings.Contains(p, ":") || req.Header.Get("X-Goog-Api-Key") != "" || req.Header.Get("X-Goog-Api-Client") != "":
		return messages.FormatGemini
	}
	return messages.FormatOpenAIChat
}

// freePath reports whether req is one of the providers' documented
// endpoints that generate nothing
// and cost nothing, which pass on a metered host under any budget (counted
// as requests with unknown usage): listing models (GET …/models and
// …/models/<id>: OpenAI, Anthropic, Gemini) and counting tokens
// (Anthropic's POST …/v1/messages/count_tokens, Gemini's POST
// …/models/<model>:countTokens, Claude on Vertex AI's POST
// …/publishers/anthropic/models/count-tokens:rawPredict, Code Assist's
// POST …/v1internal:countTokens).
func freePath(req *http.Request) bool {
	if !policy.CleanPath(req) {
		return false
	}
	p := req.URL.Path
	switch req.Method {
	case http.MethodGet:
		if strings.HasSuffix(p, "/models") {
			return true
		}
		i := strings.LastIndex(p, "/models/")
		return i >= 0 && !strings.ContainsAny(p[i+len("/models/"):], ":")
	case http.MethodPost:
		return strings.HasSuffix(p, "/v1/messages/count_tokens") ||
			(strings.Contains(p, "/models/") && strings.HasSuffix(p, ":countTokens")) ||
			strings.HasSuffix(p, "/v1internal:countTokens") ||
			strings.HasSuffix(p, "/publishers/anthropic/models/count-tokens:rawPredict")
	}
	return false
}
