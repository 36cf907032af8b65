package egress

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jetcrew/jetcrew/messages"
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

// ledger is what a session's metering counts and holds, under one lock:
// its Metering (the run's limits raised by grants), the usage so far, the
// requests in flight and what they hold, and the budget reached or held
// for.
type ledger struct {
	mu       sync.Mutex
	m        Metering
	totals   messages.UsageTotals
	inflight int64
	// reserved is what the requests in flight hold against the run's
	// own budgets (CostUSD, OutputTokens); settled is closed (and
	// replaced) whenever one ends.
	reserved  messages.BudgetSpend
	settled   chan struct{}
	events    int
	reachedOn *Budget
	// holding counts the requests held past a budget now; heldFor is
	// the budget the latest was held for.
	holding int
	heldFor Budget
}

// set sets the ledger's Metering.
func (l *ledger) set(m Metering) {
	l.mu.Lock()
	l.m = m
	l.mu.Unlock()
}

// metering returns the ledger's Metering as it is now.
func (l *ledger) metering() Metering {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m
}

// usage returns the run's model usage so far.
func (l *ledger) usage() messages.UsageTotals {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.totals
}

// raise adds by to the run's own limits (a limit of 0 stays none), and
// wakes the requests waiting for room.
func (l *ledger) raise(by Limits) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim := &l.m.Limits
	if lim.MaxCostUSD > 0 {
		lim.MaxCostUSD += by.MaxCostUSD
	}
	if lim.MaxOutputTokens > 0 {
		lim.MaxOutputTokens += by.MaxOutputTokens
	}
	if lim.MaxRequests > 0 {
		lim.MaxRequests += by.MaxRequests
	}
	if l.settled != nil { // requests waiting for room look again
		close(l.settled)
		l.settled = nil
	}
}

// limits returns the run's own limits as they are now.
func (l *ledger) limits() Limits {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m.Limits
}

// paused returns the budget the run's requests are held for, when some
// are.
func (l *ledger) paused() (Budget, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.heldFor, l.holding > 0
}

// reached returns the budget the run reached, if it did.
func (l *ledger) reached() (Budget, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reachedOn == nil {
		return Budget{}, false
	}
	return *l.reachedOn, true
}

// verdict returns the first of the run's own limits a request with worst
// case need does not fit, or nil: the request limit when it is reached
// (requests in flight counted); a cost or token limit the spent totals
// reached, or that need does not fit beside them (wait false); or one
// need fits beside the spent totals but not beside what the requests in
// flight hold too (wait true: it may fit once they end). Callers hold mu.
func (l *ledger) verdict(need messages.BudgetSpend) (b *Budget, wait bool) {
	lims, t, r := l.m.Limits, l.totals, l.reserved
	if lims.MaxRequests > 0 && t.Requests+l.inflight >= lims.MaxRequests {
		return &Budget{Key: "max_model_requests", Limit: float64(lims.MaxRequests), Spent: float64(t.Requests + l.inflight)}, false
	}
	if lim, spent, n := lims.MaxOutputTokens, t.Tokens.Output, need.OutputTokens; lim > 0 {
		b := &Budget{Key: "max_output_tokens", Limit: float64(lim), Spent: float64(spent), Need: float64(n), Reserved: float64(r.OutputTokens)}
		switch {
		case spent >= lim || n > lim-spent:
			return b, false
		case n > lim-spent-r.OutputTokens:
			return b, true
		}
	}
	if lim, spent, n := lims.MaxCostUSD, t.CostUSD, need.CostUSD; lim > 0 {
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

// hold counts a request with worst case need in flight and holds need
// against the run's own budgets, and returns nil; or returns the budget
// it does not fit (nothing held). A request that fits beside what was
// spent but not beside what the requests in flight hold waits for them to
// end (each end, or a raise, looks again), at most reserveWait or until
// ctx ends.
func (l *ledger) hold(ctx context.Context, need messages.BudgetSpend) *Budget {
	deadline := time.NewTimer(reserveWait)
	defer deadline.Stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		b, wait := l.verdict(need)
		switch {
		case b == nil:
			l.inflight++
			l.reserved = l.reserved.Add(need)
			return nil
		case !wait:
			return b
		}
		if l.settled == nil {
			l.settled = make(chan struct{})
		}
		settled, gaveUp := l.settled, false
		l.mu.Unlock()
		select {
		case <-settled:
		case <-ctx.Done():
			gaveUp = true
		case <-deadline.C:
			gaveUp = true
		}
		l.mu.Lock()
		if gaveUp {
			return b
		}
	}
}

// unhold ends a request in flight that held need, and wakes the requests
// waiting for one to end. Callers hold mu.
func (l *ledger) unhold(need messages.BudgetSpend) {
	l.inflight--
	l.reserved = l.reserved.Add(messages.BudgetSpend{CostUSD: -need.CostUSD, OutputTokens: -need.OutputTokens})
	if l.settled != nil {
		close(l.settled)
		l.settled = nil
	}
}

// release ends a request in flight that held need (unhold).
func (l *ledger) release(need messages.BudgetSpend) {
	l.mu.Lock()
	l.unhold(need)
	l.mu.Unlock()
}

// refused counts a model request the proxy refused.
func (l *ledger) refused() {
	l.mu.Lock()
	l.totals.Refused++
	l.mu.Unlock()
}

// reach counts a model request refused past budget b, and records b as
// the budget reached, the first time: it returns the callback that tells
// (Metering.Reached; nil when already told or none).
func (l *ledger) reach(b *Budget) func() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.totals.Refused++
	if l.reachedOn != nil {
		return nil
	}
	l.reachedOn = b
	if f := l.m.Reached; f != nil {
		bb := *b
		return func() { f(bb) }
	}
	return nil
}

// pause counts a request held past budget b (on) or no longer held.
func (l *ledger) pause(b Budget, on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !on {
		l.holding--
		return
	}
	l.holding++
	l.heldFor = b
}

// add ends a request in flight that held need with its usage event ev,
// counting it in the totals, and reports whether ev is within maxEvents
// (to publish).
func (l *ledger) add(ev messages.UsageEvent, need messages.BudgetSpend, maxEvents int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unhold(need)
	l.totals.Add(ev)
	if l.events >= maxEvents {
		return false
	}
	l.events++
	return true
}
