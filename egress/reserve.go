package egress

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// metered is one model request in flight.
type metered struct {
	ev     messages.UsageEvent
	req    usage.Request
	bounds usage.Bounds
	// stripUsage is set when the proxy made the request ask for usage
	// its client did not ask for: the usage chunk is taken out of the
	// answer.
	stripUsage bool
	// strict is set when the run has a cost or token budget: the
	// request's worst case is held against it (need, its part of worst),
	// and an answer whose usage is not read to its end is charged worst.
	strict bool
	worst  usage.Worst
	need   messages.BudgetSpend
	// sharedNeed is what Shared.Reserve held for the request (zero when
	// it held nothing).
	sharedNeed messages.BudgetSpend
	// up counts the request's body bytes sent upstream; complete is set
	// when the answer's body reached its end (io.EOF from the host).
	up       *countingReader
	complete atomic.Bool
	// release ends the request's own upstream context (strict only).
	release func()
	once    sync.Once // endModel
}

// plan computes m's worst case and what the run's budgets hold for it:
// when the run has a cost or token budget (its own or a shared one), the
// request's output cap and input estimate by the price table
// (usage.Prices.Worst), in the kinds the budgets limit.
func (s *Session) plan(m *metered) {
	cost, tokens := s.meter.strict()
	if !cost && !tokens {
		return
	}
	s.meter.mu.Lock()
	prices := s.meter.m.Prices
	s.meter.mu.Unlock()
	m.strict = true
	m.worst = prices.Worst(m.req.Model, m.bounds)
	if cost {
		m.need.CostUSD = m.worst.CostUSD
	}
	if tokens {
		m.need.OutputTokens = m.worst.Output
	}
}

// reserve admits m against the run's own budgets, then its shared ones:
// it returns nil once the request is counted in flight and its worst case
// (m.need) held, or the budget it does not fit (nothing held). A request
// that fits beside what was spent but not beside what the requests in
// flight hold waits for them to end, at most reserveWait or until ctx
// ends; Shared.Reserve does the same for the shared budgets.
func (s *Session) reserve(ctx context.Context, m *metered) *Budget {
	mt := &s.meter
	deadline := time.NewTimer(reserveWait)
	defer deadline.Stop()
	mt.mu.Lock()
	for {
		b, wait := mt.verdict(m.need)
		if b == nil {
			break
		}
		if !wait {
			mt.mu.Unlock()
			return b
		}
		settled := mt.settledChan()
		mt.mu.Unlock()
		select {
		case <-settled:
		case <-ctx.Done():
			return b
		case <-deadline.C:
			return b
		}
		mt.mu.Lock()
	}
	mt.inflight++
	mt.reserved = mt.reserved.Add(m.need)
	shared := mt.m.Shared
	mt.mu.Unlock()
	if shared == nil {
		return nil
	}
	b, err := shared.Reserve(ctx, m.ev.Time, m.need)
	if err != nil {
		s.log.Warn().Err(err).Msg("reserve a model request in the run's shared budgets; letting it go")
		return nil
	}
	if b != nil {
		mt.mu.Lock()
		mt.unhold(m.need)
		mt.mu.Unlock()
		return b
	}
	m.sharedNeed = m.need
	return nil
}

// unhold ends a request in flight that held need, and wakes the requests
// waiting for one to end. Callers hold mu.
func (mt *meter) unhold(need messages.BudgetSpend) {
	mt.inflight--
	mt.reserved = mt.reserved.Add(messages.BudgetSpend{CostUSD: -need.CostUSD, OutputTokens: -need.OutputTokens})
	if mt.settled != nil {
		close(mt.settled)
		mt.settled = nil
	}
}
