package egress

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// wrap meters resp, the answer to m: its body passes through
// unchanged as it arrives (less the usage chunk the proxy asked for,
// askForUsage), and its usage is recorded when it ends. Under a cost or
// token budget, an answer the agent stops reading is read on to its end
// by the proxy (drainBody), so it is settled at its real usage.
func (mt *meter) wrap(m *metered, resp *http.Response) {
	m.ev.Status = resp.StatusCode
	body := resp.Body
	if m.strict {
		body = &eofMark{ReadCloser: body, m: m}
	}
	body = usage.Wrap(m.ev.Format, m.req, resp.StatusCode, resp.Header.Get("Content-Type"), body, maxMeteredJSON,
		func(r usage.Result) { mt.end(m, r) })
	if m.stripUsage && resp.StatusCode < 400 {
		body = usage.StripUsage(body)
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
	}
	if m.strict {
		body = &drainBody{ReadCloser: body, mt: mt, m: m}
	}
	resp.Body = body
}

// askForUsage makes an OpenAI Chat stream whose client did not ask for
// usage (stream_options.include_usage) ask for it, so its usage can be
// read: the body is rewritten (its Content-Length with it) and the usage
// chunk that adds is taken out of the answer (meter.wrap). A body the
// proxy did not read whole is left as it is.
func askForUsage(req *http.Request, m *metered) {
	if m.req.Format != messages.FormatOpenAIChat || !m.req.Stream || m.req.IncludeUsage {
		return
	}
	body, n, ok := usage.IncludeUsage(req.Body)
	if !ok {
		return
	}
	req.Body, req.ContentLength = body, n
	req.Header.Del("Content-Length")
	req.TransferEncoding = nil
	req.GetBody = nil
	m.stripUsage = true
}

// upstreamCtx returns the context m goes upstream in, under a cost or
// token budget: not the run's connection's (conn), so the answer can be
// read to its end after the agent left, but the session's, cut
// drainTimeout after conn ends and when m ends (m.release).
func (mt *meter) upstreamCtx(m *metered, conn context.Context) context.Context {
	ctx, cancel := context.WithCancel(mt.life)
	var mu sync.Mutex
	var t *time.Timer
	stop := context.AfterFunc(conn, func() {
		mu.Lock()
		t = time.AfterFunc(drainTimeout, cancel)
		mu.Unlock()
	})
	m.release = func() {
		stop()
		mu.Lock()
		if t != nil {
			t.Stop()
		}
		mu.Unlock()
		cancel()
	}
	return ctx
}

// end records the usage of m's response: its event and the run's
// totals. A request that failed upstream ends with a zero Result and
// status 0.
func (mt *meter) end(m *metered, r usage.Result) {
	m.once.Do(func() {
		mt.free()
		mt.record(m, r)
		if m.release != nil {
			m.release()
		}
	})
}

// record records the usage of m's response (end, once): its event, the
// run's totals, and the shared budgets' (Shared.Settle), in place of what
// m held.
func (mt *meter) record(m *metered, r usage.Result) {
	cfg := mt.ledger.metering()
	ev := m.ev
	ev.DurationMS = time.Since(ev.Time).Milliseconds()
	ev.Model = m.req.Model
	if r.Model != "" {
		ev.Model = r.Model
	}
	if len(ev.Model) > maxModelName {
		ev.Model = strings.ToValidUTF8(ev.Model[:maxModelName], "")
	}
	ev.Stream = m.req.Stream || r.Stream
	ev.Known = r.Known
	if r.Known {
		ev.Tokens, ev.WebSearches = r.Tokens, r.WebSearches
		// A response's model without a price (a name the request's
		// resolved to) is priced as the request's, which was admitted.
		c, ok := cfg.Prices.Charge(ev.Model, r)
		if !ok {
			c, ok = cfg.Prices.Charge(m.req.Model, r)
		}
		if ok {
			ev.CostUSD, ev.PartlyUnpriced = &c.USD, c.PartlyUnpriced
		}
	}
	if m.strict && unsettled(m, r) {
		chargeWorst(&ev, m.worst)
	}
	publish := mt.ledger.add(ev, m.need, mt.maxEvents)
	if cfg.Shared != nil {
		spent := messages.BudgetSpend{OutputTokens: ev.Tokens.Output}
		if ev.CostUSD != nil {
			spent.CostUSD = *ev.CostUSD
		}
		mt.settleShared(cfg.Shared, m, spent)
	}
	if cfg.Observe != nil {
		cfg.Observe(ev)
	}
	if publish && cfg.Publish != nil {
		cfg.Publish(ev)
	}
}

// settleShared replaces what m held in the shared budgets by spent, on a
// goroutine stop's caller waits for (spends; each bounded by
// spendTimeout).
func (mt *meter) settleShared(shared Shared, m *metered, spent messages.BudgetSpend) {
	mt.spends.Add(1)
	go func() {
		defer mt.spends.Done()
		ctx, cancel := context.WithTimeout(context.Background(), spendTimeout)
		defer cancel()
		shared.Settle(ctx, m.ev.Time, m.sharedNeed, spent)
	}()
}

// unsettled reports whether m's answer, read into r, leaves what it
// spent unknown, so it is charged its worst case: the request was sent
// and its connection failed (status 0), or a success (status < 400)
// whose body did not reach its end or carried no usage. An error answer
// (>= 400) costs nothing: the providers do not bill them.
func unsettled(m *metered, r usage.Result) bool {
	switch {
	case m.ev.Status == 0:
		return m.up != nil && m.up.n.Load() > 0
	case m.ev.Status >= 400:
		return false
	}
	return !m.complete.Load() || !r.Known
}

// chargeWorst makes ev, a response whose usage was not read to its end,
// count its request's worst case w (Estimated): its tokens, web searches
// and cost, unless what was read already says more.
func chargeWorst(ev *messages.UsageEvent, w usage.Worst) {
	ev.Estimated = true
	if ev.CostUSD != nil && *ev.CostUSD > w.CostUSD {
		return
	}
	read := ev.Tokens
	ev.Tokens = w.Tokens()
	ev.Tokens.Output = max(ev.Tokens.Output, read.Output)
	ev.WebSearches = max(ev.WebSearches, w.WebSearches)
	ev.CostUSD = nil
	if w.Priced {
		c := w.CostUSD
		ev.CostUSD = &c
	}
}

// eofMark notes, on m, that the host's body reached its end.
type eofMark struct {
	io.ReadCloser
	m *metered
}

// Read implements io.Reader.
func (e *eofMark) Read(p []byte) (int, error) {
	n, err := e.ReadCloser.Read(p)
	if err == io.EOF {
		e.m.complete.Store(true)
	}
	return n, err
}

// drainBody is the body the agent reads under a cost or token budget:
// when the agent closes it before its end, the proxy reads the rest on
// its own (at most maxDrain bytes and drainTimeout, and until the
// session closes), so the answer's usage is read whole.
type drainBody struct {
	io.ReadCloser
	mt   *meter
	m    *metered
	once sync.Once
}

// Close closes the body at once when it was read to its end, else reads
// its rest on a goroutine (counted in meter.drains) and then closes it.
func (d *drainBody) Close() error {
	if d.m.complete.Load() {
		return d.ReadCloser.Close()
	}
	d.once.Do(func() {
		d.mt.drains.Add(1)
		go d.drain()
	})
	return nil
}

// drain reads the rest of the body and closes it; it ends within
// drainTimeout, or when the session closes.
func (d *drainBody) drain() {
	defer d.mt.drains.Done()
	t := time.AfterFunc(drainTimeout, func() { _ = d.ReadCloser.Close() })
	stop := context.AfterFunc(d.mt.life, func() { _ = d.ReadCloser.Close() })
	_, _ = io.CopyN(io.Discard, d.ReadCloser, maxDrain)
	t.Stop()
	stop()
	_ = d.ReadCloser.Close()
}
