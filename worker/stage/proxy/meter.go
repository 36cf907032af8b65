package proxy

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// maxModelLabels bounds the distinct model names the usage metrics carry
// as a label on one worker: the model comes from the run's own request (or
// the host's answer), so a run could otherwise grow the metrics without
// bound. Past it a model is counted as "other".
const maxModelLabels = 64

// usageMetrics are the worker's model usage counters, by profile and
// model (the pool is a constant label).
type usageMetrics struct {
	requests *prometheus.CounterVec // profile, model, usage (known, unknown)
	tokens   *prometheus.CounterVec // profile, model, kind
	cost     *prometheus.CounterVec // profile, model
	refused  *prometheus.CounterVec // profile, budget

	mu     sync.Mutex
	models map[string]bool
}

func newUsageMetrics(cfg Config) *usageMetrics {
	labels := prometheus.Labels{"worker": cfg.WorkerID, "pool": cfg.Pool}
	m := &usageMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "jetcrew", ConstLabels: labels,
			Name: "model_requests_total", Help: "Model requests of runs through their egress proxy to hosts it injects a key for, by profile, model and whether their usage was read (usage: known, unknown)."},
			[]string{"profile", "model", "usage"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "jetcrew", ConstLabels: labels,
			Name: "model_tokens_total", Help: "Tokens of runs' model responses as the provider reported them, by profile, model and kind (input, output, cache_read, cache_write)."},
			[]string{"profile", "model", "kind"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "jetcrew", ConstLabels: labels,
			Name: "model_cost_usd_total", Help: "What runs' model responses cost by the worker's price table, in US dollars, by profile and model."},
			[]string{"profile", "model"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "jetcrew", ConstLabels: labels,
			Name: "model_budget_refusals_total", Help: "Model requests the egress proxy refused because the run had reached a budget, by profile and budget."},
			[]string{"profile", "budget"}),
		models: map[string]bool{},
	}
	cfg.Registry.MustRegister(m.requests, m.tokens, m.cost, m.refused)
	return m
}

// model returns the label of model name n: n itself for the first
// maxModelLabels names, "other" past them, "unknown" for none.
func (m *usageMetrics) model(n string) string {
	if n == "" {
		return "unknown"
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.models[n] {
		return n
	}
	if len(m.models) >= maxModelLabels {
		return "other"
	}
	m.models[n] = true
	return n
}

// observe counts ev, a usage event of a run of profile.
func (m *usageMetrics) observe(profile string, ev messages.UsageEvent) {
	model := m.model(ev.Model)
	if !ev.Known {
		m.requests.WithLabelValues(profile, model, "unknown").Inc()
		return
	}
	m.requests.WithLabelValues(profile, model, "known").Inc()
	for kind, n := range map[string]int64{"input": ev.Tokens.Input, "output": ev.Tokens.Output, "cache_read": ev.Tokens.CacheRead, "cache_write": ev.Tokens.CacheWrite} {
		if n > 0 {
			m.tokens.WithLabelValues(profile, model, kind).Add(float64(n))
		}
	}
	if ev.CostUSD != nil {
		m.cost.WithLabelValues(profile, model).Add(*ev.CostUSD)
	}
}

// pricesDigest returns the price table's digest, "" for none.
func pricesDigest(p *usage.Prices) string {
	if p == nil {
		return ""
	}
	return p.Digest
}

// meter makes the run's proxy meter its model requests, with the
// profile's budgets (its own, its group's and pool's, paused or failed as
// on_budget says), the worker's price table and the pace of the keys it
// injects (inj; egress_rate).
func (s *Stage) meter(run *stage.Run, inj []egress.Injection) {
	prof := run.Profile
	s.metered, s.profile, s.run = true, prof.Name, run
	if prof.HasBudget() {
		s.budgets = &messages.ReceiptBudgets{MaxCostUSD: prof.MaxCostUSD, MaxOutputTokens: prof.MaxOutputTokens, MaxModelRequests: prof.MaxModelRequests,
			Group: receiptShared(run.Request.GroupOrID(), prof.GroupBudget), Pool: receiptShared(run.Request.WithDefaults().Pool, prof.PoolBudget),
			OnBudget: prof.BudgetAction()}
	}
	m := egress.Metering{
		Prices:       s.p.cfg.Prices,
		Limits:       egress.Limits{MaxCostUSD: prof.MaxCostUSD, MaxOutputTokens: prof.MaxOutputTokens, MaxRequests: prof.MaxModelRequests},
		SharedLimits: sharedLimits(prof.GroupBudget, prof.PoolBudget),
		Unmetered:    prof.EgressUnmetered(),
		Publish:      s.p.publishUsage,
		Observe:      func(ev messages.UsageEvent) { s.p.metrics.observe(s.profile, ev) },
		Reached: func(b egress.Budget) {
			s.p.metrics.refused.WithLabelValues(s.profile, budgetName(b)).Inc()
			s.p.publishBudget(messages.BudgetEvent{RunID: run.ID(), Time: time.Now().UTC(), Budget: budgetName(b),
				Limit: b.Limit, Spent: b.Spent, Action: "fail", Reason: b.String()})
		},
	}
	if pacer := newPacer(s.p.budgets, prof, inj, s.p.rateWait()); pacer != nil {
		m.Pacer = pacer
	}
	if s.p.budgets != nil {
		if sh := s.shared(run); sh != nil {
			s.sh, m.Shared = sh, sh
		}
		if prof.BudgetAction() == profile.OnBudgetPause {
			m.Pause = func(ctx context.Context, b egress.Budget) bool { return s.pause(ctx, run, b) }
		}
	}
	s.sess.Meter(m)
}

// sharedLimits returns what the shared budgets limit, each field the
// largest of theirs (egress.Metering.SharedLimits).
func sharedLimits(bs ...*profile.SharedBudget) egress.Limits {
	var l egress.Limits
	for _, b := range bs {
		if b != nil {
			l.MaxCostUSD = max(l.MaxCostUSD, b.MaxCostUSD)
			l.MaxOutputTokens = max(l.MaxOutputTokens, b.MaxOutputTokens)
			l.MaxRequests = max(l.MaxRequests, b.MaxModelRequests)
		}
	}
	return l
}

// CheckEvery is how often a metered run's usage is written to its record,
// an operator's grant applied and its budget looked at: twice a second.
// (The proxy refuses a request past a budget at once; this only ends the
// run.)
func (s *Stage) CheckEvery() time.Duration { return 500 * time.Millisecond }

// Check asks for the record to be written when the run met another
// upstream failure; and for a metered run applies a grant (jetcrew budget)
// to a run with budgets, asks for the record to be written when the run's
// usage or pause changed, and stops the run, failed, once its proxy
// refused a request past a budget.
func (s *Stage) Check(time.Time) (*stage.Stop, bool) {
	failed := s.sess.Totals().UpstreamFailed
	egressChanged := failed != s.failed
	s.failed = failed
	if !s.metered {
		return nil, egressChanged
	}
	if s.budgets != nil && s.p.budgets != nil {
		s.granted(context.Background(), s.run)
	}
	u := s.sess.Usage()
	_, paused := s.sess.Paused()
	changed := u != s.seen || paused != s.wasPaused || egressChanged
	s.seen, s.wasPaused = u, paused
	if b, ok := s.reached(); ok {
		return &stage.Stop{State: messages.StateFailed, Reason: b}, changed
	}
	return nil, changed
}

// publishUsage publishes a usage event on jetcrew.events.<run_id>.usage
// (a core publish, as the egress events).
func (p *Proxies) publishUsage(ev messages.UsageEvent) {
	p.publishJSON(ev.RunID, messages.EventUsage, ev)
}

// publishBudget publishes a budget event on jetcrew.events.<run_id>.budget.
func (p *Proxies) publishBudget(ev messages.BudgetEvent) {
	p.publishJSON(ev.RunID, messages.EventBudget, ev)
}

// publishJSON publishes v on jetcrew.events.<runID>.<typ>.
func (p *Proxies) publishJSON(runID string, typ messages.EventType, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	m := nats.NewMsg(messages.SubjectEvents(runID, typ))
	m.Data = b
	m.Header.Set(messages.HeaderRunID, runID)
	if err := p.cfg.NC.PublishMsg(m); err != nil {
		p.cfg.Log.Warn().Err(err).Str("run_id", runID).Str("event", string(typ)).Msg("publish event")
	}
}

// receiptShared is b, the budget shared by name, as the receipt shows it.
func receiptShared(name string, b *profile.SharedBudget) *messages.ReceiptSharedBudget {
	if b == nil {
		return nil
	}
	return &messages.ReceiptSharedBudget{Name: name, MaxCostUSD: b.MaxCostUSD, MaxOutputTokens: b.MaxOutputTokens,
		MaxModelRequests: b.MaxModelRequests, Window: b.WindowDuration().String()}
}

// Exited ends a run that sent a model request past a budget failed, with
// the budget as its reason, when it ends now: also when the agent exited
// on its own before Check stopped it (a refused request is the end the
// profile's on_budget asks for, whatever the agent did next).
func (s *Stage) Exited(_ context.Context, req *stage.ExitedRequest, resp *stage.ExitedResponse) {
	if !s.metered || !req.Final {
		return
	}
	if b, ok := s.reached(); ok {
		resp.Fail, resp.Reason = true, b
	}
}
