package proxy

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/internal/budgetkv"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// Bounds of the shared budgets' reads and writes.
const (
	// budgetReadTimeout bounds reading a run's shared budgets before one
	// of its model requests.
	budgetReadTimeout = 5 * time.Second
	// pausePoll is how often a paused run looks for a grant.
	pausePoll = 500 * time.Millisecond
	// reserveWait bounds how long a request whose worst case fits a
	// shared budget only once requests in flight end waits for them;
	// reservePoll is how often it looks again.
	reserveWait = 2 * time.Minute
	reservePoll = 250 * time.Millisecond
)

// budgetStore is the worker's handle on the jetcrew-budgets bucket, opened
// on first use (the worker provisions it).
type budgetStore struct {
	js jetstream.JetStream
	mu sync.Mutex
	kv jetstream.KeyValue
}

func (b *budgetStore) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kv != nil {
		return b.kv, nil
	}
	kv, err := b.js.KeyValue(ctx, messages.BucketBudgets)
	if err != nil {
		return nil, fmt.Errorf("budgets bucket %s: %w", messages.BucketBudgets, err)
	}
	b.kv = kv
	return kv, nil
}

// get reads key's BudgetSpend and its revision (budgetkv.Get).
func (b *budgetStore) get(ctx context.Context, key string) (messages.BudgetSpend, uint64, error) {
	kv, err := b.bucket(ctx)
	if err != nil {
		return messages.BudgetSpend{}, 0, err
	}
	return budgetkv.Get(ctx, kv, key)
}

// AddIf adds d to key's BudgetSpend by compare-and-set when admit allows
// (budgetkv.AddIf).
func (b *budgetStore) AddIf(ctx context.Context, key string, d messages.BudgetSpend, admit func(messages.BudgetSpend) bool) (messages.BudgetSpend, bool, error) {
	kv, err := b.bucket(ctx)
	if err != nil {
		return messages.BudgetSpend{}, false, err
	}
	return budgetkv.AddIf(ctx, kv, key, d, admit)
}

// Add adds d to key's BudgetSpend by compare-and-set (budgetkv.Add).
func (b *budgetStore) Add(ctx context.Context, key string, d messages.BudgetSpend) (messages.BudgetSpend, error) {
	kv, err := b.bucket(ctx)
	if err != nil {
		return messages.BudgetSpend{}, err
	}
	return budgetkv.Add(ctx, kv, key, d)
}

// scoped is one shared budget of a run: its scope, the group (its
// messages.GroupRef.Key) or pool it is shared by, and the profile's limits.
type scoped struct {
	scope, name string
	b           *profile.SharedBudget
}

// sharedBudgets is a run's egress.Shared: its group's and its pool's
// budgets in the jetcrew-budgets bucket, each over its window, plus what
// an operator granted the group (messages.GrantKey). A worker that dies
// with a request in flight leaves that request's reservation in its
// window's key until the window ends (jetcrew budget --group can make up
// for it): the request stays counted and its worst case held, so the
// budget counts more than was spent, never less.
//
// A run adopted by another worker (Stage.Adopt) keeps what it spent in
// these keys, added by the worker that spent it; the adopter adds only
// what is spent under it (the run's record seeds its own totals, never
// these keys) and settles only what it reserved itself, so nothing is
// counted twice or given back twice. A worker that leaves the run
// (SIGUSR2) settles its requests in flight as it goes (Release); one that
// dies leaves their reservations, as above.
type sharedBudgets struct {
	store  *budgetStore
	scopes []scoped
	log    func(err error)
}

// Reserve implements egress.Shared: for each budget, in one
// compare-and-set on its key for the window that holds at, it checks what
// was spent and what requests in flight hold against the limits (plus the
// group's grant) and, when worst fits, counts the request and holds worst
// (BudgetSpend.ReservedCostUSD, ReservedOutputTokens); so no limit is
// passed, however many workers send at once, while each answer costs at
// most its reservation. A budget worst does not fit beside what was spent
// is returned at once; one it fits only once the requests in flight end is
// looked at again every reservePoll, for at most reserveWait. What was
// held in the budgets checked before the one returned is given back.
func (s *sharedBudgets) Reserve(ctx context.Context, at time.Time, worst messages.BudgetSpend) (*egress.Budget, error) {
	deadline := time.Now().Add(reserveWait)
	for {
		b, wait, err := s.tryReserve(ctx, at, worst)
		if err != nil || b == nil || !wait || time.Now().After(deadline) {
			return b, err
		}
		select {
		case <-ctx.Done():
			return b, nil
		case <-time.After(reservePoll):
		}
	}
}

// tryReserve is one pass of Reserve over the budgets: it returns nil
// when every one held worst, else the first that did not and whether it
// may once requests in flight end (nothing held then).
func (s *sharedBudgets) tryReserve(ctx context.Context, at time.Time, worst messages.BudgetSpend) (*egress.Budget, bool, error) {
	hold := messages.BudgetSpend{Requests: 1, ReservedCostUSD: worst.CostUSD, ReservedOutputTokens: worst.OutputTokens}
	var held []string
	undo := func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budgetReadTimeout)
		defer cancel()
		for _, key := range held {
			if _, err := s.store.Add(uctx, key, negate(hold)); err != nil {
				s.log(err)
			}
		}
	}
	for _, sc := range s.scopes {
		b, wait, key, err := s.reserveIn(ctx, sc, at, worst, hold)
		if err != nil || b != nil {
			undo()
			return b, wait, err
		}
		held = append(held, key)
	}
	return nil, false, nil
}

// reserveIn adds hold to sc's key for at when worst fits its limits,
// returning the key; else the budget it does not fit.
func (s *sharedBudgets) reserveIn(ctx context.Context, sc scoped, at time.Time, worst, hold messages.BudgetSpend) (*egress.Budget, bool, string, error) {
	ctx, cancel := context.WithTimeout(ctx, budgetReadTimeout)
	defer cancel()
	grant, err := s.grant(ctx, sc)
	if err != nil {
		return nil, false, "", err
	}
	key := messages.BudgetKey(sc.scope, sc.name, sc.b.WindowDuration(), at)
	var b *egress.Budget
	var wait bool
	_, _, err = s.store.AddIf(ctx, key, hold, func(spent messages.BudgetSpend) bool {
		b, wait = verdict(sc, spent, grant, worst)
		return b == nil
	})
	return b, wait, key, err
}

// grant returns what an operator granted sc's budget: a group's grant
// key; nothing for a pool.
func (s *sharedBudgets) grant(ctx context.Context, sc scoped) (messages.BudgetSpend, error) {
	if sc.scope != messages.BudgetScopeGroup {
		return messages.BudgetSpend{}, nil
	}
	g, _, err := s.store.get(ctx, messages.GrantKey(sc.scope, sc.name))
	return g, err
}

// fits reports whether the shared budget b names would now admit (or may
// admit once requests in flight end) a request needing what b.Need says,
// in the current window: read only, for a paused request.
func (s *sharedBudgets) fits(ctx context.Context, b egress.Budget) bool {
	ctx, cancel := context.WithTimeout(ctx, budgetReadTimeout)
	defer cancel()
	var need messages.BudgetSpend
	switch b.Key {
	case "max_cost_usd":
		need.CostUSD = b.Need
	case "max_output_tokens":
		need.OutputTokens = int64(b.Need)
	}
	for _, sc := range s.scopes {
		if sc.scope != b.Scope {
			continue
		}
		grant, err := s.grant(ctx, sc)
		if err != nil {
			return false
		}
		spent, _, err := s.store.get(ctx, messages.BudgetKey(sc.scope, sc.name, sc.b.WindowDuration(), time.Now()))
		if err != nil {
			return false
		}
		over, wait := verdict(sc, spent, grant, need)
		return over == nil || wait
	}
	return false
}

// Settle implements egress.Shared: it replaces what Reserve held for a
// request sent at at (worst) by what its answer spent, in each budget's
// key for the window that holds at.
func (s *sharedBudgets) Settle(ctx context.Context, at time.Time, worst, spent messages.BudgetSpend) {
	d := messages.BudgetSpend{CostUSD: spent.CostUSD, OutputTokens: spent.OutputTokens,
		ReservedCostUSD: -worst.CostUSD, ReservedOutputTokens: -worst.OutputTokens}
	if d == (messages.BudgetSpend{}) {
		return
	}
	for _, sc := range s.scopes {
		if _, err := s.store.Add(ctx, messages.BudgetKey(sc.scope, sc.name, sc.b.WindowDuration(), at), d); err != nil {
			// The response is in the run's own totals; the shared budget
			// misses it (and keeps its reservation until the window ends).
			s.log(err)
		}
	}
}

// negate returns -d, field by field.
func negate(d messages.BudgetSpend) messages.BudgetSpend {
	return messages.BudgetSpend{CostUSD: -d.CostUSD, OutputTokens: -d.OutputTokens, Requests: -d.Requests,
		ReservedCostUSD: -d.ReservedCostUSD, ReservedOutputTokens: -d.ReservedOutputTokens}
}

// verdict returns the limit of sc (each raised by grant, an operator's
// raise of each limit that is set) that a request needing need does not
// fit, or nil: the request limit when spent reached it; a cost or token
// limit spent reached, or that need does not fit beside spent (wait
// false), or fits beside spent but not beside what requests in flight
// hold too (wait true).
func verdict(sc scoped, spent, grant, need messages.BudgetSpend) (*egress.Budget, bool) {
	if maxReq := sc.b.MaxModelRequests; maxReq > 0 && spent.Requests >= maxReq+grant.Requests {
		return &egress.Budget{Scope: sc.scope, Key: "max_model_requests", Limit: float64(maxReq + grant.Requests), Spent: float64(spent.Requests)}, false
	}
	if maxOut := sc.b.MaxOutputTokens; maxOut > 0 {
		lim, n := maxOut+grant.OutputTokens, need.OutputTokens
		b := &egress.Budget{Scope: sc.scope, Key: "max_output_tokens", Limit: float64(lim), Spent: float64(spent.OutputTokens),
			Need: float64(n), Reserved: float64(spent.ReservedOutputTokens)}
		switch {
		case spent.OutputTokens >= lim || n > lim-spent.OutputTokens:
			return b, false
		case n > lim-spent.OutputTokens-spent.ReservedOutputTokens:
			return b, true
		}
	}
	if maxCost := sc.b.MaxCostUSD; maxCost > 0 {
		lim, n := maxCost+grant.CostUSD, need.CostUSD
		b := &egress.Budget{Scope: sc.scope, Key: "max_cost_usd", Limit: lim, Spent: spent.CostUSD, Need: n, Reserved: spent.ReservedCostUSD}
		switch {
		case spent.CostUSD >= lim || spent.CostUSD+n > lim:
			return b, false
		case spent.CostUSD+spent.ReservedCostUSD+n > lim:
			return b, true
		}
	}
	return nil, false
}

// shared returns the run's shared budgets, nil when its profile has none.
func (s *Stage) shared(run *stage.Run) *sharedBudgets {
	prof := run.Profile
	var sc []scoped
	if prof.GroupBudget != nil {
		// The group's key names its pool too: the same group name in
		// another pool is another group, with a budget of its own.
		sc = append(sc, scoped{messages.BudgetScopeGroup, run.Request.GroupRef().Key(), prof.GroupBudget})
	}
	if prof.PoolBudget != nil {
		sc = append(sc, scoped{messages.BudgetScopePool, run.Request.WithDefaults().Pool, prof.PoolBudget})
	}
	if len(sc) == 0 {
		return nil
	}
	log := s.p.cfg.Log.With().Str("run_id", run.ID()).Logger()
	return &sharedBudgets{store: s.p.budgets, scopes: sc, log: func(err error) {
		log.Warn().Err(err).Msg("a shared budget misses a model response")
	}}
}

// pause holds a model request of the run past budget b (on_budget =
// "pause") until an operator raises the budget (a grant for the run or its
// group, jetcrew budget), the shared budget's window turns over, or the
// profile's budget_pause has passed since the run's requests were first
// held; it reports whether the request may be looked at again. The first
// hold of each pause is a budget event with action "pause". While it holds
// a request, the run's stall clock stands still (stage.Progress.Hold): a
// run waiting for a grant is not stalled, whatever its stall_timeout.
func (s *Stage) pause(ctx context.Context, run *stage.Run, b egress.Budget) bool {
	defer run.Progress.Hold()()
	s.pmu.Lock()
	if s.pausedSince.IsZero() {
		s.pausedSince = time.Now()
		s.p.publishBudget(messages.BudgetEvent{RunID: run.ID(), Time: time.Now().UTC(), Budget: budgetName(b),
			Limit: b.Limit, Spent: b.Spent, Action: "pause", Reason: b.String()})
	}
	until := s.pausedSince.Add(run.Profile.BudgetPauseDuration())
	s.pmu.Unlock()
	// A grant raises the session's limits, here or in Check (whichever
	// reads it first): either way they differ from these.
	held := s.sess.Limits()
	t := time.NewTicker(pausePoll)
	defer t.Stop()
	for {
		if s.granted(ctx, run) || s.sess.Limits() != held {
			s.resume()
			return true
		}
		if b.Scope != "" && s.sh != nil && s.sh.fits(ctx, b) {
			s.resume()
			return true
		}
		if time.Now().After(until) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// resume ends the run's pause.
func (s *Stage) resume() {
	s.pmu.Lock()
	s.pausedSince = time.Time{}
	s.pmu.Unlock()
}

// granted applies what an operator granted the run since it last looked
// (its grant key's value, cumulative) to its session's limits, and
// reports whether the grant grew.
func (s *Stage) granted(ctx context.Context, run *stage.Run) bool {
	ctx, cancel := context.WithTimeout(ctx, budgetReadTimeout)
	defer cancel()
	g, _, err := s.p.budgets.get(ctx, messages.GrantKey(messages.BudgetScopeRun, run.ID()))
	if err != nil {
		return false
	}
	s.pmu.Lock()
	d := egress.Limits{MaxCostUSD: g.CostUSD - s.grant.CostUSD, MaxOutputTokens: g.OutputTokens - s.grant.OutputTokens, MaxRequests: g.Requests - s.grant.Requests}
	grew := d.MaxCostUSD > 0 || d.MaxOutputTokens > 0 || d.MaxRequests > 0
	s.grant = g
	s.pmu.Unlock()
	if grew {
		s.sess.Raise(d)
	}
	return grew // a group's grant is read by sharedBudgets.Over
}

// budgetName is b's name in a BudgetEvent: the profile key, under its
// table for a shared one ("group_budget.max_cost_usd").
func budgetName(b egress.Budget) string {
	if b.Scope != "" {
		return b.Scope + "_budget." + b.Key
	}
	return b.Key
}
