package dispatcher

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/internal/budgetkv"
	"github.com/jetcrew/jetcrew/messages"
)

// Budgets raises the model-usage budgets of runs and groups, by grants.
// It is the Dispatcher's role for the jetcrew-budgets bucket (Grant,
// GrantRun); it reads runs' states through RunStates.
type Budgets struct {
	js   jetstream.JetStream
	runs *RunStates
}

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
func (b *Budgets) Grant(ctx context.Context, scope, name string, by messages.BudgetSpend) (messages.BudgetSpend, error) {
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
	kv, err := b.js.KeyValue(ctx, messages.BucketBudgets)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return messages.BudgetSpend{}, ErrNoBudgets
	}
	if err != nil {
		return messages.BudgetSpend{}, fmt.Errorf("grant: %w", err)
	}
	return budgetkv.Add(ctx, kv, messages.GrantKey(scope, name), by)
}

// ErrRunEnded is returned by GrantRun for a run that has already ended:
// nothing of it could use a grant (a replay of it would).
var ErrRunEnded = errors.New("the run has ended")

// RunGrant is what GrantRun did: the run's grant total and the state the
// run was in.
type RunGrant struct {
	// Total is the run's grant so far, this one included.
	Total messages.BudgetSpend
	// State is messages.StateRunning, or messages.StateQueued for a run no
	// worker runs yet (its request waits in JETCREW_RUNS, a replay's
	// included): its worker applies the grant when the run starts.
	State messages.State
}

// GrantRun raises run id's own model budget by by, as Grant does, once it
// found the run able to use it: running, or queued. It grants nothing, and
// says why, for a run that has ended (an error wrapping ErrRunEnded that
// names its final state) or that is known neither by a state nor by a
// queued request (ErrRunNotFound). Its other errors are Grant's, Status's
// and Request's.
func (b *Budgets) GrantRun(ctx context.Context, id string, by messages.BudgetSpend) (RunGrant, error) {
	if err := messages.ValidateToken("run id", id); err != nil {
		return RunGrant{}, fmt.Errorf("grant: %w", err)
	}
	state, err := b.grantable(ctx, id)
	if err != nil {
		return RunGrant{}, err
	}
	total, err := b.Grant(ctx, messages.BudgetScopeRun, id, by)
	if err != nil {
		return RunGrant{}, err
	}
	return RunGrant{Total: total, State: state}, nil
}

// grantable returns the state of run id when a grant can reach it
// (running or queued), else the error that says why not.
func (b *Budgets) grantable(ctx context.Context, id string) (messages.State, error) {
	st, err := b.runs.Status(ctx, id)
	switch {
	case err == nil && !st.State.Final():
		if st.State == messages.StateQueued {
			return messages.StateQueued, nil
		}
		return messages.StateRunning, nil
	case err != nil && !errors.Is(err, ErrRunNotFound):
		return "", err
	}
	// No state, or a final one: a request of the run may still wait (not
	// yet taken, or a replay). The request a final state belongs to stays
	// in the stream a moment after the state is written (the worker acks or
	// terms it then): it is no run to grant to.
	if q, qerr := b.runs.Request(ctx, id); qerr == nil {
		if err != nil || q.Sequence > st.StreamSeq {
			return messages.StateQueued, nil
		}
	} else if !errors.Is(qerr, ErrRunNotFound) {
		return "", qerr
	}
	if err != nil {
		return "", refusedGrant{fmt.Sprintf("run %s is unknown (no state, no request waiting in %s): nothing granted", id, messages.StreamRuns), ErrRunNotFound}
	}
	return "", refusedGrant{fmt.Sprintf("run %s has ended (%s): nothing granted", id, st.State), ErrRunEnded}
}

// refusedGrant is GrantRun's error for a run a grant cannot reach: its
// message says why, and it wraps ErrRunEnded or ErrRunNotFound.
type refusedGrant struct {
	msg string
	err error
}

func (e refusedGrant) Error() string { return e.msg }
func (e refusedGrant) Unwrap() error { return e.err }

// validBudgetName checks a grant's name: a run id, or a group's
// messages.GroupRef.Key.
func validBudgetName(scope, name string) error {
	if scope == messages.BudgetScopeGroup {
		_, err := messages.ParseGroupKey(name)
		return err
	}
	return messages.ValidateToken(scope, name)
}
