package egress

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// wrapModel meters resp, the answer to m: its body passes through
// unchanged as it arrives, and its usage is recorded when it ends.
func (s *Session) wrapModel(m *metered, resp *http.Response) {
	m.ev.Status = resp.StatusCode
	resp.Body = usage.Wrap(m.ev.Format, m.req, resp.StatusCode, resp.Header.Get("Content-Type"), resp.Body, maxMeteredJSON,
		func(r usage.Result) { s.endModel(m, r) })
	if m.stripUsage && resp.StatusCode < 400 {
		resp.Body = usage.StripUsage(resp.Body)
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
	}
}

// askForUsage makes an OpenAI Chat stream whose client did not ask for
// usage (stream_options.include_usage) ask for it, so its usage can be
// read: the body is rewritten (its Content-Length with it) and the usage
// chunk that adds is taken out of the answer (wrapModel). A body the
// proxy did not read whole is left as it is.
func (s *Session) askForUsage(req *http.Request, m *metered) {
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

// endModel records the usage of m's response: its event and the run's
// totals. A request that failed
// upstream ends with a zero Result (unknown usage).
func (s *Session) endModel(m *metered, r usage.Result) {
	m.once.Do(func() {
		<-s.metering
		s.recordModel(m, r)
	})
}

// recordModel records the usage of m's response (endModel, once).
func (s *Session) recordModel(m *metered, r usage.Result) {
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
	mt := &s.meter
	mt.mu.Lock()
	if r.Known {
		ev.Tokens = r.Tokens
		// A response's model without a price (a name the request's
		// resolved to) is priced as the request's, which was admitted.
		c, ok := mt.m.Prices.Cost(ev.Model, r.Tokens)
		if !ok {
			c, ok = mt.m.Prices.Cost(m.req.Model, r.Tokens)
		}
		if ok {
			ev.CostUSD = &c
		}
	}
	mt.inflight--
	mt.totals.Add(ev)
	publish := mt.events < s.cfg.MaxEvents
	if publish {
		mt.events++
	}
	pub, obs, shared := mt.m.Publish, mt.m.Observe, mt.m.Shared
	if shared != nil {
		mt.spends.Add(1)
	}
	mt.mu.Unlock()
	if shared != nil {
		go func() {
			defer mt.spends.Done()
			ctx, cancel := context.WithTimeout(context.Background(), spendTimeout)
			defer cancel()
			shared.Spend(ctx, ev)
		}()
	}
	if obs != nil {
		obs(ev)
	}
	if publish && pub != nil {
		pub(ev)
	}
}
