package egress

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/egress/policy"
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
	Unmetered policy.UnmeteredPaths
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

// strict reports whether the run has a cost budget and a token budget,
// its own or a shared one (SharedLimits): what it cannot meter is then
// refused.
func (m Metering) strict() (cost, tokens bool) {
	l, sh := m.Limits, m.SharedLimits
	return l.MaxCostUSD > 0 || sh.MaxCostUSD > 0, l.MaxOutputTokens > 0 || sh.MaxOutputTokens > 0
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

// meter meters a session's model requests: each is admitted against the
// run's budgets (begin), its answer read for its usage (wrap) and settled
// when it ends (end). What it counts and holds is its ledger.
type meter struct {
	ledger    ledger
	runID     string
	maxEvents int // Config.MaxEvents
	log       zerolog.Logger
	// slots has a slot per model request metered now (Config.MaxMetered).
	slots chan struct{}
	// life ends when the session closes (stop): the upstream requests
	// and drains of answers the agent left (drainBody) end with it;
	// drains counts those.
	life    context.Context
	endLife context.CancelFunc
	drains  sync.WaitGroup
	// spends are the Shared.Settle calls in flight.
	spends sync.WaitGroup
}

// newMeter returns the meter of run runID's session, metering nothing
// until Session.Meter is called.
func newMeter(cfg Config, runID string, log zerolog.Logger) *meter {
	mt := &meter{runID: runID, maxEvents: cfg.MaxEvents, log: log, slots: make(chan struct{}, cfg.MaxMetered)}
	mt.life, mt.endLife = context.WithCancel(context.Background())
	return mt
}

// free gives back the slot of a request that took one (begin).
func (mt *meter) free() { <-mt.slots }

// stop ends the meter's life and waits for the drains, each of which ends
// with it.
func (mt *meter) stop() {
	mt.endLife()
	mt.drains.Wait()
}

// Meter sets how the session meters its run's model requests. Call it
// before the run's container starts: requests before it are metered with
// no prices, limits or publisher.
func (s *Session) Meter(m Metering) { s.meter.ledger.set(m) }

// Usage returns the run's model usage so far.
func (s *Session) Usage() messages.UsageTotals { return s.meter.ledger.usage() }

// Raise adds to the run's own Limits (an operator's grant): a limit that
// was 0 (none) stays none. Requests held past a budget (Metering.Pause)
// look again when their Pause returns.
func (s *Session) Raise(by Limits) { s.meter.ledger.raise(by) }

// Limits returns the run's own limits as they are now (raised by grants).
func (s *Session) Limits() Limits { return s.meter.ledger.limits() }

// Paused returns the budget the run's requests are held for, when some
// are (Metering.Pause).
func (s *Session) Paused() (Budget, bool) { return s.meter.ledger.paused() }

// Reached returns the budget the run reached, if it did.
func (s *Session) Reached() (Budget, bool) { return s.meter.ledger.reached() }
