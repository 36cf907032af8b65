package main

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/messages"
)

func (a runCmds) budgetCmd() *cobra.Command {
	var url, pool string
	var group bool
	var tokens, requests int64
	cmd := &cobra.Command{
		Use:   "budget [flags] RUN_ID|GROUP [+USD]",
		Short: "Raise a run's or a group's model budget",
		Long: `budget raises the model budget of a run (or, with --group, of a group:
its group_budget) by an operator's grant: +USD on max_cost_usd, and
--output-tokens / --requests on max_output_tokens / max_model_requests.
Only limits the profile sets grow. Grants add up; the run's worker applies
them within about half a second, and a run that its profile pauses at a
budget (on_budget = "pause") goes on. A run's grant is given only while the
run can use it: running, or queued (applied when it starts); for a run that
has ended, or a run id known nowhere, budget says so, grants nothing and
exits 1. The grant is kept in the jetcrew-budgets bucket under
grant.run.<id> or grant.group.<pool>.<group> (an operator's role may write
those keys, and only those). A group is named by its pool and its name:
--pool names the pool, and without it the one pool whose runs name the
group is taken (the default pool when none does; several: give --pool).

  jetcrew budget r1 +2.50
  jetcrew budget --group refactor +10 --output-tokens 200000`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var usd float64
			if len(args) == 2 {
				v, err := strconv.ParseFloat(strings.TrimPrefix(args[1], "+"), 64)
				if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) || !strings.HasPrefix(args[1], "+") {
					return usageError(fmt.Errorf("%q: the amount is +USD, such as +2.50", args[1]))
				}
				usd = v
			}
			if tokens < 0 || requests < 0 {
				return usageError(fmt.Errorf("--output-tokens and --requests raise a budget: they must not be negative"))
			}
			if usd == 0 && tokens == 0 && requests == 0 {
				return usageError(fmt.Errorf("nothing to grant: give +USD, --output-tokens or --requests"))
			}
			scope := messages.BudgetScopeRun
			if group {
				scope = messages.BudgetScopeGroup
			} else if pool != "" {
				return usageError(fmt.Errorf("--pool names a group's pool: give it with --group"))
			}
			return a.runBudget(cmd.Context(), url, scope, args[0], pool, messages.BudgetSpend{CostUSD: usd, OutputTokens: tokens, Requests: requests})
		},
	}
	natsFlag(cmd, &url)
	cmd.Flags().BoolVar(&group, "group", false, "raise the budget of the group named (its group_budget), not of a run")
	cmd.Flags().StringVar(&pool, "pool", "", "with --group, the group's pool (default: the one pool whose runs name the group)")
	cmd.Flags().Int64Var(&tokens, "output-tokens", 0, "output tokens to add to max_output_tokens")
	cmd.Flags().Int64Var(&requests, "requests", 0, "model requests to add to max_model_requests")
	return cmd
}

func (a runCmds) runBudget(ctx context.Context, url, scope, name, pool string, by messages.BudgetSpend) error {
	if err := messages.ValidateToken(scope, name); err != nil {
		return usageError(err)
	}
	if pool != "" {
		if err := messages.ValidateToken("--pool", pool); err != nil {
			return usageError(err)
		}
	}
	d, closeNATS, err := a.dispatcher(a.natsURL(url), "jetcrew budget")
	if err != nil {
		return err
	}
	defer closeNATS()
	var total messages.BudgetSpend
	note := ""
	if scope == messages.BudgetScopeRun {
		g, err := d.GrantRun(ctx, name, by)
		if err != nil {
			return err
		}
		total = g.Total
		if g.State == messages.StateQueued {
			note = "; the run is queued: its worker applies the grant when it starts"
		}
	} else {
		g, err := resolveGroup(ctx, d.RunStates, a.stderr, name, pool)
		if err != nil {
			return err
		}
		name = g.String()
		if total, err = d.Grant(ctx, scope, g.Key(), by); err != nil {
			return err
		}
	}
	fmt.Fprintf(visible(a.stdout), "%s %s: granted $%.4f, %d output tokens, %d requests (in all: $%.4f, %d output tokens, %d requests)%s\n",
		scope, name, by.CostUSD, by.OutputTokens, by.Requests, total.CostUSD, total.OutputTokens, total.Requests, note)
	return nil
}
