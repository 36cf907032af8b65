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
// an operator granted the group (messages.GrantKey).
type sharedBudgets struct {
	store  *budgetStore
	scopes []scoped
	log    func(err error)
}

// Over implements egress.Shared: for each budget, in one compare-and-set
// on its key for the current window, it checks the spend against the
// limits (plus the group's grant) and, when none is reached, counts the
// request; so max_model_requests is never passed, however many workers
// send at once. It returns the first budget reached (nothing counted for
// it, though a budget checked before it counted the request).
func (s *sharedBudgets) Over(ctx context.Context) (*egress.Budget, error) {
	ctx, cancel := context.WithTimeout(ctx, budgetReadTimeout)
	defer cancel()
	now := time.Now()
	for _, sc := range s.scopes {
		var grant messages.BudgetSpend
		if sc.scope == messages.BudgetScopeGroup {
			var err error
			if grant, _, err = s.store.get(ctx, messages.GrantKey(sc.scope, sc.name)); err != nil {
				return nil, err
			}
		}
		var b *egress.Budget
		_, _, err := s.store.AddIf(ctx, messages.BudgetKey(sc.scope, sc.name, sc.b.WindowDuration(), now), messages.BudgetSpend{Requests: 1},
			func(spent messages.BudgetSpend) bool {
				b = reached(sc.scope, sc.b.MaxCostUSD, sc.b.MaxOutputTokens, sc.b.MaxModelRequests, spent, grant)
				return b == nil
			})
		if err != nil {
			return nil, err
		}
		if b != nil {
			return b, nil
		}
	}
	return nil, nil
}

// Spend implements egress.Shared: it adds ev's cost and output tokens to
// each budget's key for the window that holds the response's start (its
// request was counted by Over).
func (s *sharedBudgets) Spend(ctx context.Context, ev messages.UsageEvent) {
	d := messages.BudgetSpend{OutputTokens: ev.Tokens.Output}
	if ev.CostUSD != nil {
		d.CostUSD = *ev.CostUSD
	}
	if d == (messages.BudgetSpend{}) {
		return
	}
	for _, sc := range s.scopes {
		if _, err := s.store.Add(ctx, messages.BudgetKey(sc.scope, sc.name, sc.b.WindowDuration(), ev.Time), d); err != nil {
			// The response is in the run's own totals; the shared budget
			// misses it.
			s.log(err)
		}
	}
}

// reached returns the budget of scope that spent (plus grant, an
// operator's raise of each limit that is set) has reached, or nil.
func reached(scope string, maxCost float64, maxOut, maxReq int64, spent, grant messages.BudgetSpend) *egress.Budget {
	switch {
	case maxReq > 0 && spent.Requests >= maxReq+grant.Requests:
		return &egress.Budget{Scope: scope, Key: "max_model_requests", Limit: float64(maxReq + grant.Requests), Spent: float64(spent.Requests)}
	case maxOut > 0 && spent.OutputTokens >= maxOut+grant.OutputTokens:
		return &egress.Budget{Scope: scope, Key: "max_output_tokens", Limit: float64(maxOut + grant.OutputTokens), Spent: float64(spent.OutputTokens)}
	case maxCost > 0 && spent.CostUSD >= maxCost+grant.CostUSD:
		return &egress.Budget{Scope: scope, Key: "max_cost_usd", Limit: maxCost + grant.CostUSD, Spent: spent.CostUSD}
	}
	return nil
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
		if b.Scope != "" && s.sh != nil {
			if over, err := s.sh.Over(ctx); err == nil && over == nil {
				s.resume()
				return true
			}
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
