package egress

import (
	"context"
	"sync"
	"sync/atomic"

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
	// worstKnown is set once worst is computed (worstCase), strict or
	// not.
	worstKnown bool
	// sharedNeed is what Shared.Reserve held for the request (zero when
	// it held nothing).
	sharedNeed messages.BudgetSpend
	// up counts the request's body bytes sent upstream; complete is set
	// when the answer's body reached its end (io.EOF from the host).
	up       *countingReader
	complete atomic.Bool
	// release ends the request's own upstream context (strict only).
	release func()
	once    sync.Once // meter.end
}

// worstCase returns m's worst case by prices (usage.Prices.Worst: its
// output cap and input estimate), computed once for the request.
func (m *metered) worstCase(prices *usage.Prices) usage.Worst {
	if !m.worstKnown {
		m.worst, m.worstKnown = prices.Worst(m.req.Model, m.bounds), true
	}
	return m.worst
}

// plan computes what the run's budgets hold for m: when the run has a
// cost or token budget (its own or a shared one; cost, tokens), its worst
// case by prices, in the kinds the budgets limit.
func (m *metered) plan(prices *usage.Prices, cost, tokens bool) {
	if !cost && !tokens {
		return
	}
	m.strict = true
	m.worstCase(prices)
	if cost {
		m.need.CostUSD = m.worst.CostUSD
	}
	if tokens {
		m.need.OutputTokens = m.worst.Output
	}
}

// reserve admits m against the run's own budgets (ledger.hold), then its
// shared ones: it returns nil once the request is counted in flight and
// its worst case (m.need) held, or the budget it does not fit (nothing
// held). Shared.Reserve waits for the shared budgets as hold does for the
// run's own.
func (mt *meter) reserve(ctx context.Context, m *metered) *Budget {
	if b := mt.ledger.hold(ctx, m.need); b != nil {
		return b
	}
	shared := mt.ledger.metering().Shared
	if shared == nil {
		return nil
	}
	b, err := shared.Reserve(ctx, m.ev.Time, m.need)
	if err != nil {
		mt.log.Warn().Err(err).Msg("reserve a model request in the run's shared budgets; letting it go")
		return nil
	}
	if b != nil {
		mt.ledger.release(m.need)
		return b
	}
	m.sharedNeed = m.need
	return nil
}
