package coordination

import (
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/jetcrew/jetcrew/coordination/relay"
)

// callClass is a kind of bridge call, each with its own token bucket.
type callClass int

const (
	callSend  callClass = iota // send, refused or not
	callRead                   // status, inbox and claims
	callClaim                  // claim and release, refused or not
	callAsk                    // ask and reply, refused or not
)

// refusalEventEvery is how often, at most, a run's rate-limited calls are
// reported as an EventRefused: the first one at once, then one per interval
// carrying how many were refused since (Event.Count), and one more when the
// session ends. Refusals are counted, never stored one by one.
const refusalEventEvery = 10 * time.Second

// callFree is the class of an endpoint no call limit applies to (the
// launcher's steering polls, the bridge's notices, hello: each answers at
// most what another limit let in).
const callFree callClass = -1

// callLimits are a session's token buckets (Config.SendRate/SendBurst,
// Config.ReadRate/ReadBurst, ClaimRate/ClaimBurst, Questions.Rate/Burst)
// and its count of refused calls.
type callLimits struct {
	c                      *core
	send, read, claim, ask *rate.Limiter
	events                 *rate.Limiter // refusal events
	// pending counts rate-limited calls not yet reported in an event.
	pending atomic.Int64
	// total counts every rate-limited call of the session.
	total atomic.Int64
}

// newCallLimits returns the call limits of c's session, every bucket full.
func newCallLimits(c *core) *callLimits {
	cfg := c.h.cfg
	return &callLimits{
		c:      c,
		send:   rate.NewLimiter(rateLimit(cfg.SendRate), cfg.SendBurst),
		read:   rate.NewLimiter(rateLimit(cfg.ReadRate), cfg.ReadBurst),
		claim:  rate.NewLimiter(rateLimit(cfg.ClaimRate), cfg.ClaimBurst),
		ask:    rate.NewLimiter(rateLimit(cfg.Questions.Rate), cfg.Questions.Burst),
		events: rate.NewLimiter(rate.Every(refusalEventEvery), 1),
	}
}

// rateLimit is the limiter rate of perSecond calls per second: negative
// means unlimited.
func rateLimit(perSecond float64) rate.Limit {
	if perSecond < 0 {
		return rate.Inf
	}
	return rate.Limit(perSecond)
}

// allow takes a token for one call of class c. Without one it returns the
// 429 the agent reads as a tool error, and counts the refusal, reporting it
// as an event only as often as refusalEventEvery allows.
func (l *callLimits) allow(c callClass) error {
	cfg := &l.c.h.cfg
	lim, what, perSec, burst := l.send, "send", cfg.SendRate, cfg.SendBurst
	switch c {
	case callRead:
		lim, what, perSec, burst = l.read, "status, inbox and claims", cfg.ReadRate, cfg.ReadBurst
	case callClaim:
		lim, what, perSec, burst = l.claim, "claim and release", cfg.ClaimRate, cfg.ClaimBurst
	case callAsk:
		lim, what, perSec, burst = l.ask, "ask and reply", cfg.Questions.Rate, cfg.Questions.Burst
	}
	if lim.Allow() {
		return nil
	}
	ae := &apiError{status: http.StatusTooManyRequests, code: relay.CodeRateLimited,
		msg: fmt.Sprintf("rate limited: a run may make %s calls at %s per second on average, in bursts of %d; wait a few seconds and call again",
			what, strconv.FormatFloat(perSec, 'g', -1, 64), burst)}
	l.total.Add(1)
	n := l.pending.Add(1)
	if l.events.Allow() {
		l.pending.Add(-n)
		l.c.emit(Event{Kind: EventRefused, Reason: ae.msg, Count: int(n)})
	}
	return ae
}

// flush reports the rate-limited calls not yet reported, at the session's
// end.
func (l *callLimits) flush() {
	if n := l.pending.Swap(0); n > 0 {
		l.c.emit(Event{Kind: EventRefused, Reason: "rate limited (calls refused since the last report)", Count: int(n)})
	}
}

// RateLimited returns how many of the session's calls were refused for
// their rate so far.
func (s *Session) RateLimited() int64 { return s.limits.total.Load() }
