package egress

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// Bounds of the metering of one model request.
const (
	// maxMeteredRequest is how much of a model request's body the proxy
	// reads to learn its model, whether it streams and its output cap,
	// and to rewrite it (askForUsage). A larger body is refused under a
	// cost or token budget (what it may cost is unknown) and otherwise
	// goes upstream unread (its model is then taken from the response,
	// where every metered format names it).
	maxMeteredRequest = 4 << 20
	// maxMeteredJSON is how much of a response that is not a stream the
	// proxy keeps to read its usage at the end (past it the response is
	// passed on whole but its usage is unknown), and the longest line or
	// event of a stream it reads. With Config.MaxMetered requests at once
	// a run makes the proxy hold at most MaxMetered × (2 × 4 MiB + 4 MiB)
	// for metering (a request, its rewritten copy, an answer): 192 MiB
	// with the default, reached only by a run sending 16 bodies of 4 MiB
	// at once.
	maxMeteredJSON = 4 << 20
	// reserveWait bounds how long a request whose worst case fits the
	// budget but not beside the requests in flight waits for them to end
	// (their real cost is usually below their reservation); past it, it
	// is refused as past the budget.
	reserveWait = 2 * time.Minute
	// drainTimeout and maxDrain bound reading the rest of an answer the
	// agent stopped reading, under a cost or token budget, to settle it
	// at its real usage: past either (or when the provider's connection
	// fails) the request is charged its reservation.
	drainTimeout = 5 * time.Minute
	maxDrain     = 64 << 20
	// spendTimeout bounds adding one response to the shared budgets.
	spendTimeout = 30 * time.Second
	// maxModelName is the longest model name an event keeps, in bytes (the
	// run chooses it): a longer one is cut.
	maxModelName = 128
)

// Limits are a run's budgets, enforced by its egress proxy on the model
// requests to the hosts it injects a key for (the only way the run reaches
// them). A zero field is no limit.
//
// Before a request is sent, its worst case (usage.Prices.Worst: its
// output cap at the output price, plus its input estimated from the
// body's size) is reserved against the cost and token limits; when the
// answer ends the reservation is replaced by the real usage. A request
// whose worst case does not fit what is left (spent and reserved) waits
// for the requests in flight to end (at most reserveWait), and is refused
// with the provider's own quota error (usage.QuotaError) when it cannot
// fit beside what was spent. So the run never spends past a cost or token
// limit, as long as no answer costs more than its reservation (input the
// body does not carry, usage.BytesPerInputToken); a request limit is
// never passed (requests are counted when they are sent).
type Limits struct {
	// MaxCostUSD is the most the run may spend, in US dollars by the
	// price table (profile key max_cost_usd). A request for a model the
	// table has no price for is refused; the parts of a response the
	// table prices in part (UsageEvent.PartlyUnpriced) cost what it prices.
	MaxCostUSD float64
	// MaxOutputTokens is the most output tokens the run may be sent
	// (profile key max_output_tokens).
	MaxOutputTokens int64
	// MaxRequests is the most model requests the run may send (profile
	// key max_model_requests), Known usage or not.
	MaxRequests int64
}

// Budget names the limit a run reached, or that a request's worst case
// did not fit: the profile key, the limit, what the run had spent of it,
// and what the request needed.
type Budget struct {
	// Scope is "" for the run's own budget, messages.BudgetScopeGroup or
	// messages.BudgetScopePool for one it shares (profile keys
	// group_budget, pool_budget).
	Scope string
	// Key is the budget's key: "max_cost_usd", "max_output_tokens",
	// "max_model_requests".
	Key string
	// Limit and Spent are in the key's unit (US dollars, tokens,
	// requests).
	Limit, Spent float64
	// Need is the refused request's worst case in that unit, when the
	// limit was not reached yet but the request did not fit what was
	// left; Reserved what the requests in flight held then.
	Need, Reserved float64
}

// String says which budget was reached and how much was spent ("budget
// reached: max_cost_usd 2.5 (spent 2.5123 USD)"; a shared one is named
// "group_budget.max_cost_usd").
func (b Budget) String() string {
	key := b.Key
	if b.Scope != "" {
		key = b.Scope + "_budget." + b.Key
	}
	fits := b.Spent < b.Limit && b.Need > 0
	held := ""
	if b.Reserved > 0 {
		held = ", and requests in flight hold "
	}
	switch b.Key {
	case "max_cost_usd":
		if fits {
			if held != "" {
				held += usd(b.Reserved) + " USD"
			}
			return fmt.Sprintf("budget reached: %s %s (spent %s USD%s; this request may cost up to %s USD)", key, formatFloat(b.Limit), usd(b.Spent), held, usd(b.Need))
		}
		return fmt.Sprintf("budget reached: %s %s (spent %s USD)", key, formatFloat(b.Limit), usd(b.Spent))
	case "max_output_tokens":
		if fits {
			if held != "" {
				held += fmt.Sprintf("%d", int64(b.Reserved))
			}
			return fmt.Sprintf("budget reached: %s %d (spent %d output tokens%s; this request may generate up to %d)", key, int64(b.Limit), int64(b.Spent), held, int64(b.Need))
		}
		return fmt.Sprintf("budget reached: %s %d (spent %d output tokens)", key, int64(b.Limit), int64(b.Spent))
	default:
		return fmt.Sprintf("budget reached: %s %d (%d model requests sent)", key, int64(b.Limit), int64(b.Spent))
	}
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func usd(f float64) string { return strconv.FormatFloat(f, 'f', 4, 64) }

// Metering is how a session meters its run's model requests: every request
// to a host it injects a key for (Injection) is metered; other hosts are
// never seen in clear.
type Metering struct {
	// Prices prices the tokens; nil prices nothing (only tokens are
	// counted).
	Prices *usage.Prices
	// Limits are the run's budgets.
	Limits Limits
	// Publish receives one UsageEvent per model response, within
	// Config.MaxEvents (past it the totals still count). It must not block
	// for long.
	Publish func(messages.UsageEvent)
	// Observe, when set, is told of every usage event, past MaxEvents too:
	// for metrics. It must not block.
	Observe func(messages.UsageEvent)
	// Reached is called once, from the proxy's goroutine, when the run
	// first sends a model request past one of its Limits or a Shared
	// budget and the request is refused (the budget that was reached): a
	// run that reaches a limit with its last request ends as it would
	// have. It must not block.
	Reached func(Budget)
	// Shared are the budgets the run shares with other runs (its group's,
	// its pool's), kept outside the session; nil: none.
	Shared Shared
	// Pause, when set, holds a request past a budget instead of refusing
	// it at once (profile key on_budget = "pause"): it is called with the
	// budget and blocks until the budget was raised (Raise; true: the
	// request is looked at again) or it gives up (false: the request is
	// refused and Reached called) or ctx (the run's connection) ends.
	Pause func(ctx context.Context, b Budget) bool
	// Unmetered are the requests the profile lets pass without usage
	// while the run has a cost or token budget (egress_unmetered_paths).
	Unmetered UnmeteredPaths
	// SharedLimits are what the run's Shared budgets limit: a field set
	// in any of them is set here (its value is not used otherwise), so
	// the proxy refuses what it cannot meter for them as for the run's
	// own Limits.
	SharedLimits Limits
	// Pacer, when set, paces the run's requests to each injected host
	// by its key's rate, shared by every run using the key (profile key
	// egress_rate); nil: none.
	Pacer Pacer
}

// Pacer paces model requests per injected key across a fleet: a token
// bucket of requests and tokens per minute that every worker takes from
// (worker/stage/proxy keeps it in a NATS key-value bucket).
type Pacer interface {
	// Take takes one request and tokens (the request's input estimate
	// plus its output cap; 0 when unknown) from the bucket of host's key,
	// waiting for them up to the pacer's bound or until ctx ends. It
	// returns 0 once taken, or how long until they could be when that
	// is past the bound (nothing taken). An error lets the request go
	// (and is logged): a store that cannot be read does not stop every
	// run.
	Take(ctx context.Context, host string, tokens int64) (retryAfter time.Duration, err error)
}

// Shared is a budget a run shares with other runs, on any worker: its
// group's or its pool's over a window (worker/stage/proxy keeps them in
// a NATS key-value bucket).
type Shared interface {
	// Reserve is called before each model request, sent at at, with its
	// worst case (CostUSD, OutputTokens; zero when the run's budgets do
	// not limit them): when every shared budget admits it, the request
	// is counted and its worst case reserved in each (ReservedCostUSD,
	// ReservedOutputTokens of the window that holds at), and Reserve
	// returns nil; else nothing stays counted and it returns the budget
	// that does not admit it, after waiting (at most reserveWait, or
	// until ctx ends) for requests in flight elsewhere to end when the
	// request would fit beside what was spent. An error lets the request
	// go unreserved (and is logged): a budget store that cannot be read
	// does not stop every run.
	Reserve(ctx context.Context, at time.Time, worst messages.BudgetSpend) (*Budget, error)
	// Settle replaces what Reserve held for a request sent at at (worst;
	// zero when Reserve held nothing) by what its answer spent. It is
	// called on a goroutine of its own, which Close waits for.
	Settle(ctx context.Context, at time.Time, worst, spent messages.BudgetSpend)
}

// meter is a session's metering state.
type meter struct {
	mu       sync.Mutex
	m        Metering
	totals   messages.UsageTotals
	inflight int64
	// reserved is what the requests in flight hold against the run's
	// own budgets (CostUSD, OutputTokens); settled is closed (and
	// replaced) whenever one ends.
	reserved messages.BudgetSpend
	settled  chan struct{}
	events   int
	reached  *Budget
	// paused counts the requests held past a budget now; pausedOn is
	// the budget the latest was held for.
	paused   int
	pausedOn Budget
	// spends are the Shared.Spend calls in flight.
	spends sync.WaitGroup
}

// Meter sets how the session meters its run's model requests. Call it
// before the run's container starts: requests before it are metered with
// no prices, limits or publisher.
func (s *Session) Meter(m Metering) {
	s.meter.mu.Lock()
	s.meter.m = m
	s.meter.mu.Unlock()
}

// Usage returns the run's model usage so far.
func (s *Session) Usage() messages.UsageTotals {
	s.meter.mu.Lock()
	defer s.meter.mu.Unlock()
	return s.meter.totals
}

// Raise adds to the run's own Limits (an operator's grant): a limit that
// was 0 (none) stays none. Requests held past a budget (Metering.Pause)
// look again when their Pause returns.
func (s *Session) Raise(by Limits) {
	s.meter.mu.Lock()
	defer s.meter.mu.Unlock()
	l := &s.meter.m.Limits
	if l.MaxCostUSD > 0 {
		l.MaxCostUSD += by.MaxCostUSD
	}
	if l.MaxOutputTokens > 0 {
		l.MaxOutputTokens += by.MaxOutputTokens
	}
	if l.MaxRequests > 0 {
		l.MaxRequests += by.MaxRequests
	}
	if mt := &s.meter; mt.settled != nil { // requests waiting for room look again
		close(mt.settled)
		mt.settled = nil
	}
}

// Limits returns the run's own limits as they are now (raised by grants).
func (s *Session) Limits() Limits {
	s.meter.mu.Lock()
	defer s.meter.mu.Unlock()
	return s.meter.m.Limits
}

// Paused returns the budget the run's requests are held for, when some
// are (Metering.Pause).
func (s *Session) Paused() (Budget, bool) {
	s.meter.mu.Lock()
	defer s.meter.mu.Unlock()
	return s.meter.pausedOn, s.meter.paused > 0
}

// Reached returns the budget the run reached, if it did.
func (s *Session) Reached() (Budget, bool) {
	s.meter.mu.Lock()
	defer s.meter.mu.Unlock()
	if s.meter.reached == nil {
		return Budget{}, false
	}
	return *s.meter.reached, true
}

// verdict returns the first of the run's own limits a request with worst
// case need does not fit, or nil: the request limit when it is reached
// (requests in flight counted); a cost or token limit the spent totals
// reached, or that need does not fit beside them (wait false); or one
// need fits beside the spent totals but not beside what the requests in
// flight hold too (wait true: it may fit once they end). Callers hold mu.
func (mt *meter) verdict(need messages.BudgetSpend) (b *Budget, wait bool) {
	l, t, r := mt.m.Limits, mt.totals, mt.reserved
	if l.MaxRequests > 0 && t.Requests+mt.inflight >= l.MaxRequests {
		return &Budget{Key: "max_model_requests", Limit: float64(l.MaxRequests), Spent: float64(t.Requests + mt.inflight)}, false
	}
	if lim, spent, n := l.MaxOutputTokens, t.Tokens.Output, need.OutputTokens; lim > 0 {
		b := &Budget{Key: "max_output_tokens", Limit: float64(lim), Spent: float64(spent), Need: float64(n), Reserved: float64(r.OutputTokens)}
		switch {
		case spent >= lim || n > lim-spent:
			return b, false
		case n > lim-spent-r.OutputTokens:
			return b, true
		}
	}
	if lim, spent, n := l.MaxCostUSD, t.CostUSD, need.CostUSD; lim > 0 {
		b := &Budget{Key: "max_cost_usd", Limit: lim, Spent: spent, Need: n, Reserved: r.CostUSD}
		switch {
		case spent >= lim || spent+n > lim:
			return b, false
		case spent+r.CostUSD+n > lim:
			return b, true
		}
	}
	return nil, false
}

// settledChan returns a channel closed when a request in flight next
// ends. Callers hold mu.
func (mt *meter) settledChan() <-chan struct{} {
	if mt.settled == nil {
		mt.settled = make(chan struct{})
	}
	return mt.settled
}

// strict reports whether the run has a cost budget and a token budget,
// its own or a shared one (Metering.SharedLimits): what it cannot meter is
// then refused.
func (mt *meter) strict() (cost, tokens bool) {
	mt.mu.Lock()
	defer mt.mu.Unlock()
	l, sh := mt.m.Limits, mt.m.SharedLimits
	return l.MaxCostUSD > 0 || sh.MaxCostUSD > 0, l.MaxOutputTokens > 0 || sh.MaxOutputTokens > 0
}

// note records b as the budget reached, the first time, and returns the
// callback to tell (nil when already told).
func (mt *meter) note(b *Budget) func() {
	if b == nil || mt.reached != nil {
		return nil
	}
	mt.reached = b
	if f := mt.m.Reached; f != nil {
		bb := *b
		return func() { f(bb) }
	}
	return nil
}

// meteredAddr refuses target, the checked address of a connection to a
// host the session does not inject a key for, when it is the address and
// port of one it does (resolved now): another name for a metered host would
// otherwise carry the run's model requests past the metering and its
// budgets (with a key the run brought itself). It returns the refusal's
// reason, or "".
func (s *Session) meteredAddr(ctx context.Context, target netip.AddrPort) string {
	for _, in := range s.inject {
		if in.Port != int(target.Port()) {
			continue
		}
		if a, err := netip.ParseAddr(in.Name); err == nil {
			if a.Unmap() == target.Addr() {
				return fmt.Sprintf("the address of %s, a host the proxy meters: reach it by that name", in.Name)
			}
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
		addrs, err := s.cfg.Resolver.LookupNetIP(rctx, "ip", in.Name)
		cancel()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if a.Unmap() == target.Addr() {
				return fmt.Sprintf("the address of %s, a host the proxy meters: reach it by that name", in.Name)
			}
		}
	}
	return ""
}
