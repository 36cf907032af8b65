package dispatcher

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/internal/budgetkv"
	"github.com/jetcrew/jetcrew/messages"
)

// ErrNoBudgets is returned by Grant when the jetcrew-budgets bucket does
// not exist: no worker of this version has provisioned the installation.
var ErrNoBudgets = errors.New("no budgets bucket (" + messages.BucketBudgets + "): start a worker first")

// Grant raises the model budget of scope (messages.BudgetScopeRun with a
// run id, messages.BudgetScopeGroup with a group's messages.GroupRef.Key,
// "<pool>.<group>") by d, an operator's
// grant: it adds d to the key messages.GrantKey(scope, name) by
// compare-and-set, so grants given at once add up. A run's worker applies
// it within about half a second: its own limits that are set (max_cost_usd,
// ...) or its group's (group_budget) grow by d, and requests a paused run
// holds (on_budget = "pause") go on. It returns the grant's new total, or
// ErrNoBudgets, or the bucket's error; a name that is not a valid token is
// an error before any I/O.
func (d *Dispatcher) Grant(ctx context.Context, scope, name string, by messages.BudgetSpend) (messages.BudgetSpend, error) {
	if scope != messages.BudgetScopeRun && scope != messages.BudgetScopeGroup {
		return messages.BudgetSpend{}, fmt.Errorf("grant: scope %q is not %q or %q", scope, messages.BudgetScopeRun, messages.BudgetScopeGroup)
	}
	if err := validBudgetName(scope, name); err != nil {
		return messages.BudgetSpend{}, fmt.Errorf("grant: %w", err)
	}
	if by.CostUSD < 0 || by.OutputTokens < 0 || by.Requests < 0 {
		return messages.BudgetSpend{}, errors.New("grant: a budget is raised, never lowered")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultRequestTimeout)
		defer cancel()
	}
	kv, err := d.js.KeyValue(ctx, messages.BucketBudgets)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return messages.BudgetSpend{}, ErrNoBudgets
	}
	if err != nil {
		return messages.BudgetSpend{}, fmt.Errorf("grant: %w", err)
	}
	return budgetkv.Add(ctx, kv, messages.GrantKey(scope, name), by)
}

// validBudgetName checks a grant's name: a run id, or a group's
// messages.GroupRef.Key.
func validBudgetName(scope, name string) error {
	if scope == messages.BudgetScopeGroup {
		_, err := messages.ParseGroupKey(name)
		return err
	}
	return messages.ValidateToken(scope, name)
}
