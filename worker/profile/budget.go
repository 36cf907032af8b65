package profile

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jetcrew/jetcrew/messages"
)

// BudgetConfig is the profile facet of a run's model budgets.
//
// The egress stage reads it: its proxy meters the hosts of egress_inject
// and enforces these there (egress.Limits); a warm container takes all of
// it from its run.
type BudgetConfig struct {
	// MaxCostUSD is the run's model budget in US dollars, by the worker's
	// price table (--prices), enforced by its egress proxy on the hosts of
	// egress_inject: the first model request after the run's priced usage
	// reached it is answered with the provider's quota error and the run
	// ends failed (egress.Limits; the overshoot bound is documented
	// there). 0 (default): none. Needs egress_inject.
	MaxCostUSD float64 `toml:"max_cost_usd" json:"max_cost_usd,omitempty"`
	// MaxOutputTokens is the run's budget of output tokens, as the model
	// API reported them (as MaxCostUSD). 0 (default): none.
	MaxOutputTokens int64 `toml:"max_output_tokens" json:"max_output_tokens,omitempty"`
	// MaxModelRequests is the most model requests the run may send (as
	// MaxCostUSD; counted when sent, so never overshot). 0 (default):
	// none.
	MaxModelRequests int64 `toml:"max_model_requests" json:"max_model_requests,omitempty"`
	// GroupBudget is the budget every run of a group shares (the
	// request's group, else its id), on any worker, over a window;
	// PoolBudget the one every run of the pool shares. Kept in the
	// jetcrew-budgets key-value bucket. Nil: none. Needs egress_inject.
	GroupBudget *SharedBudget `toml:"group_budget" json:"group_budget,omitempty"`
	PoolBudget  *SharedBudget `toml:"pool_budget" json:"pool_budget,omitempty"`
	// OnBudget is what happens to a run's model request past a budget:
	// "fail" (or "", the default) answers it with the provider's quota error and ends
	// the run failed; "pause" holds it (and the run's later ones) until an
	// operator raises the budget (jetcrew budget) or BudgetPause passes,
	// then fails as "fail" does.
	OnBudget string `toml:"on_budget" json:"on_budget,omitempty"`
	// BudgetPause is how long "pause" holds a request, a Go duration;
	// default DefaultBudgetPause.
	BudgetPause string `toml:"budget_pause" json:"budget_pause,omitempty"`

	onBudget    string
	budgetPause time.Duration
}

// SharedBudget is a budget runs share (Profile.GroupBudget, PoolBudget):
// what they may spend together within each window. Zero fields are no
// limit.
type SharedBudget struct {
	// MaxCostUSD is in US dollars by the worker's price table.
	MaxCostUSD float64 `toml:"max_cost_usd" json:"max_cost_usd,omitempty"`
	// MaxOutputTokens counts output tokens.
	MaxOutputTokens int64 `toml:"max_output_tokens" json:"max_output_tokens,omitempty"`
	// MaxModelRequests counts model requests.
	MaxModelRequests int64 `toml:"max_model_requests" json:"max_model_requests,omitempty"`
	// Window is how long a budget lasts before it starts again, a Go
	// duration from 1m to 168h (messages.MaxBudgetWindow); windows are
	// aligned to the Unix epoch. Default "24h".
	Window string `toml:"window" json:"window,omitempty"`
	window time.Duration
}

// WindowDuration returns the budget's window.
func (b *SharedBudget) WindowDuration() time.Duration { return b.window }

// What on_budget may say.
const (
	// OnBudgetFail refuses a request past a budget and ends the run.
	OnBudgetFail = "fail"
	// OnBudgetPause holds it until the budget is raised.
	OnBudgetPause = "pause"
)

// DefaultBudgetPause is how long on_budget = "pause" holds a request by
// default.
const DefaultBudgetPause = 15 * time.Minute

// resolve applies on_budget's default (fail; the key stays as written),
// parses budget_pause and each shared budget's window (default 24h), each
// into a copy of the budget: the parsed profile's stays as written.
func (b *BudgetConfig) resolve() error {
	b.onBudget = cmp.Or(b.OnBudget, OnBudgetFail)
	var err error
	if b.budgetPause, err = parseDuration("budget_pause", b.BudgetPause, DefaultBudgetPause); err != nil {
		return err
	}
	for _, sb := range []**SharedBudget{&b.GroupBudget, &b.PoolBudget} {
		if *sb == nil {
			continue
		}
		c := **sb
		if c.window, err = parseDuration("budget window", c.Window, 24*time.Hour); err != nil {
			return err
		}
		*sb = &c
	}
	return nil
}

// validate checks the model budgets: not negative, finite, and only on a
// profile whose proxy meters a host (metered: egress_inject set), the only
// place they can be enforced.
func (b BudgetConfig) validate(metered bool) error {
	if b.MaxCostUSD < 0 || math.IsNaN(b.MaxCostUSD) || math.IsInf(b.MaxCostUSD, 0) {
		return fmt.Errorf("max_cost_usd %v must be a positive number of US dollars, or 0 for none", b.MaxCostUSD)
	}
	if b.MaxOutputTokens < 0 || b.MaxModelRequests < 0 {
		return errors.New("max_output_tokens and max_model_requests must not be negative")
	}
	for name, sb := range map[string]*SharedBudget{"group_budget": b.GroupBudget, "pool_budget": b.PoolBudget} {
		if sb == nil {
			continue
		}
		if sb.MaxCostUSD < 0 || math.IsNaN(sb.MaxCostUSD) || math.IsInf(sb.MaxCostUSD, 0) || sb.MaxOutputTokens < 0 || sb.MaxModelRequests < 0 {
			return fmt.Errorf("%s: max_cost_usd, max_output_tokens and max_model_requests must be positive, or 0 for none", name)
		}
		if sb.window < time.Minute || sb.window > messages.MaxBudgetWindow {
			return fmt.Errorf("%s: window %s must be between 1m and %s", name, sb.window, messages.MaxBudgetWindow)
		}
	}
	switch b.OnBudget {
	case "", OnBudgetFail, OnBudgetPause:
	default:
		return fmt.Errorf("on_budget %q must be %q or %q", b.OnBudget, OnBudgetFail, OnBudgetPause)
	}
	if b.budgetPause < time.Second || b.budgetPause > 24*time.Hour {
		return fmt.Errorf("budget_pause %s must be between 1s and 24h", b.budgetPause)
	}
	if b.HasBudget() && !metered {
		return errors.New("max_cost_usd, max_output_tokens, max_model_requests, group_budget and pool_budget need egress_inject: the egress proxy meters (and enforces budgets on) only the hosts it adds a key for, which the agent then cannot reach another way")
	}
	return nil
}

// HasBudget reports whether the profile sets any model budget at all.
// That is a budget of its own runs' or a shared one.
func (b BudgetConfig) HasBudget() bool {
	return b.MaxCostUSD > 0 || b.MaxOutputTokens > 0 || b.MaxModelRequests > 0 || b.GroupBudget.set() || b.PoolBudget.set()
}

// set reports whether b limits anything.
func (b *SharedBudget) set() bool {
	return b != nil && (b.MaxCostUSD > 0 || b.MaxOutputTokens > 0 || b.MaxModelRequests > 0)
}

// BudgetAction returns what happens to a request past a budget, defaulted.
// It is OnBudgetFail or OnBudgetPause: the on_budget key, default fail.
func (b BudgetConfig) BudgetAction() string { return b.onBudget }

// BudgetPauseDuration returns how long on_budget = "pause" holds a
// request.
func (b BudgetConfig) BudgetPauseDuration() time.Duration { return b.budgetPause }
