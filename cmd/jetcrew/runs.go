package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// runsOptions are the flags of `jetcrew runs`: the web console's filters.
type runsOptions struct {
	url, state, pool, profile, group string
	search                           string
	labels                           []string
	limit                            int
	asJSON                           bool
}

func (a runCmds) runsCmd() *cobra.Command {
	var o runsOptions
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "List runs, newest first, with the web console's filters",
		Long: `runs lists the runs of the jetcrew-runs bucket, newest first: id, state,
pool, profile, group, queue time and why it ended as it did. The flags filter
as the web console's runs page does; --label may be repeated (every label must
match); --search is a case-insensitive substring of the id, group, a label
(key=value) or the reason; --state failure lists every failed, timed-out or
stalled run. A run without a group shows "-". Runs no worker has taken yet have no state: they are listed queued
from their requests in JETCREW_RUNS (the first 100, oldest first), each
reason saying the run's place in its pool's queue. With --json it prints a
JSON array of the state records (docs/wire.md, "Run state").`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runRuns(cmd.Context(), o)
		},
	}
	natsFlag(cmd, &o.url)
	fs := cmd.Flags()
	fs.StringVar(&o.state, "state", "", "only runs in this state: queued, running, succeeded, failed, cancelled, timed_out, stalled; failure: any of failed, timed_out, stalled")
	fs.StringVar(&o.search, "search", "", "only runs whose id, group, label (k=v) or reason contains this, whatever the case")
	fs.StringVar(&o.pool, "pool", "", "only runs of this pool")
	fs.StringVar(&o.profile, "profile", "", "only runs of this profile")
	fs.StringVar(&o.group, "group", "", "only runs of this coordination group")
	fs.StringArrayVar(&o.labels, "label", nil, "only runs with this label, k=v (repeatable)")
	fs.IntVar(&o.limit, "limit", 50, "most runs listed; 0 lists all")
	fs.BoolVar(&o.asJSON, "json", false, "print the state records as a JSON array")
	return cmd
}

// filter checks the flags and returns the filter they describe.
func (o runsOptions) filter() (dispatcher.RunFilter, error) {
	f := dispatcher.RunFilter{State: messages.State(o.state), Pool: o.pool, Profile: o.profile, Group: o.group, Search: o.search}
	if o.state != "" && !validState(f.State) {
		return f, usageError(fmt.Errorf("--state %q: not a run state", o.state))
	}
	for _, l := range o.labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return f, usageError(fmt.Errorf("--label %q: want key=value", l))
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
	}
	if o.limit < 0 {
		return f, usageError(fmt.Errorf("--limit %d: must not be negative", o.limit))
	}
	return f, nil
}

func validState(s messages.State) bool {
	return s == messages.StateQueued || s == messages.StateRunning || s == dispatcher.AnyFailure || s.Final()
}

func (a runCmds) runRuns(ctx context.Context, o runsOptions) error {
	f, err := o.filter()
	if err != nil {
		return err
	}
	d, closeNATS, err := a.dispatcher(a.natsURL(o.url), "jetcrew runs")
	if err != nil {
		return err
	}
	defer closeNATS()
	runs, err := listRuns(ctx, d.RunStates, a.stderr, f)
	if err != nil {
		return err
	}
	if o.limit > 0 && len(runs) > o.limit {
		runs = runs[:o.limit]
	}
	if o.asJSON {
		if runs == nil {
			runs = []messages.RunState{}
		}
		b, err := json.MarshalIndent(runs, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "%s\n", inertJSON(b))
		return err
	}
	return printRuns(a.stdout, runs)
}

// listRuns returns the runs that pass f, newest first: those with a state,
// and, unless f wants another state, the queued runs no worker has taken
// yet, from their requests (a note on stderr says when only the first of
// them were read).
func listRuns(ctx context.Context, d *dispatcher.RunStates, stderr io.Writer, f dispatcher.RunFilter) ([]messages.RunState, error) {
	all, err := d.Runs(ctx, dispatcher.RunFilter{})
	if err != nil {
		return nil, err
	}
	var runs []messages.RunState
	has := make(map[string]bool, len(all))
	for i := range all {
		has[all[i].ID] = true
		if f.Match(&all[i]) {
			runs = append(runs, all[i])
		}
	}
	if f.State == "" || f.State == messages.StateQueued {
		// Runs no worker has taken have no state: their requests say.
		reqs, total, err := d.Requests(ctx, dispatcher.DefaultRequestRead)
		if err != nil && !errors.Is(err, dispatcher.ErrNotProvisioned) {
			return nil, err
		}
		for _, st := range dispatcher.WaitingRuns(reqs, func(id string) bool { return has[id] }) {
			if f.Match(&st) {
				runs = append(runs, st)
			}
		}
		slices.SortFunc(runs, func(a, b messages.RunState) int { return dispatcher.Newer(&a, &b) })
		if total > uint64(len(reqs)) {
			fmt.Fprintf(visible(stderr), "jetcrew: queued runs are read from the first %d of the %d requests in %s\n",
				len(reqs), total, messages.StreamRuns)
		}
	}
	return runs, nil
}

// printRuns writes runs as a table for people; a reason's control
// characters are shown escaped (visibleString).
func printRuns(w io.Writer, runs []messages.RunState) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tPOOL\tPROFILE\tGROUP\tQUEUED\tREASON")
	for _, st := range runs {
		group := st.Group
		if group == st.ID || group == "" {
			group = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", st.ID, st.State, st.Pool, st.Profile, group,
			formatTime(st.QueuedAt), visibleString(oneLine(st.Reason, 60)))
	}
	return tw.Flush()
}
