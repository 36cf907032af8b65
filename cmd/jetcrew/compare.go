package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-git/go-git/v5/utils/diff"
	"github.com/sergi/go-diff/diffmatchpatch"
	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// TestReportArtifact is the artifact compare reads a run's test results
// from (dispatcher.TestReportArtifact).
const TestReportArtifact = dispatcher.TestReportArtifact

func (a resultCmds) compareCmd() *cobra.Command {
	var url, pool string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "compare [flags] GROUP [RUN_A RUN_B]",
		Short: "Compare the attempts of a group, or two attempts' patches",
		Long: `compare prints one line per run of GROUP (submit --attempts), in the
order they were submitted: its id, profile, outcome, duration (from its
container's start to its end), the files it changed with the insertions and
deletions of its diffstat, the model tokens (all kinds summed) and cost its
egress proxy metered, and its tests as passed/total when it left a test
report (.jetcrew/artifacts/test-report.json holding {"passed": N,
"failed": M}; "?" when that file is not such an object). "-" marks what a
run does not have. A group is named by its pool and its name: --pool names
the pool, and without it the one pool whose runs name GROUP is taken
(several such pools: give --pool). Only the runs a worker admitted to the
group are listed: a request refused its group (another key, no key: see
docs/security.md) is not one of its attempts.

With two run ids it prints how their patches differ instead (an interdiff):
a line per file either patch touches (same, differ, only in A, only in B),
then for each file that differs the lines of A's patch (-) and B's (+)
around the lines they share. Like diff, it is exact when piped and shown
escaped on a terminal. Take an attempt with "jetcrew apply RUN_ID".

With --json, compare GROUP prints the attempts as a JSON array instead,
one object per run in the same order (docs/cli.md): run_id, profile,
state, reason, exit_code, duration_ms, files_changed, insertions,
deletions, tokens, cost_usd, tests ({"passed": N, "failed": M}),
tests_unreadable and bundle; a field a run does not have is left out.`,
		Example: `  jetcrew compare 01JF3Z6W8Q2ZP6C7V8N9Q0R1ST
  jetcrew compare --json 01JF3Z6W8Q2ZP6C7V8N9Q0R1ST
  jetcrew compare 01JF3Z6W8Q2ZP6C7V8N9Q0R1ST 01JF3Z6W8Q2ZP6C7V8N9Q0R1ST-1 01JF3Z6W8Q2ZP6C7V8N9Q0R1ST-2`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 2 {
				return usageError(errors.New("want GROUP, or GROUP RUN_A RUN_B: one run id given"))
			}
			if len(args) > 3 {
				return usageError(fmt.Errorf("want GROUP [RUN_A RUN_B], got %d arguments", len(args)))
			}
			return exactArgs("GROUP")(cmd, args[:min(len(args), 1)])
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			for i, s := range args {
				what := "group"
				if i > 0 {
					what = "run id"
				}
				if err := messages.ValidateToken(what, s); err != nil {
					return usageError(err)
				}
			}
			if pool != "" {
				if err := messages.ValidateToken("--pool", pool); err != nil {
					return usageError(err)
				}
			}
			d, closeNATS, err := a.dispatcher(a.natsURL(url), "jetcrew compare")
			if err != nil {
				return err
			}
			defer closeNATS()
			if len(args) == 3 {
				if asJSON {
					return usageError(errors.New("--json is for compare GROUP: an interdiff is a patch"))
				}
				if err := checkAttempts(cmd.Context(), d, args[0], pool, args[1], args[2]); err != nil {
					return err
				}
				return a.interdiff(cmd.Context(), d, args[1], args[2])
			}
			return a.compareGroup(cmd.Context(), d, args[0], pool, asJSON)
		},
	}
	natsFlag(cmd, &url)
	cmd.Flags().StringVar(&pool, "pool", "", "the group's pool (default: the one pool whose runs name GROUP)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the group's attempts as a JSON array")
	return cmd
}

// checkAttempts refuses to compare runs ids[0] and ids[1] unless both are
// runs a worker admitted to group name (of pool, when given): the same
// pool and group.
func checkAttempts(ctx context.Context, d *dispatcher.Dispatcher, name, pool string, ids ...string) error {
	var first string
	for _, id := range ids {
		st, err := d.Status(ctx, id)
		if err != nil {
			return fmt.Errorf("run %s: %w", id, err)
		}
		if st.Group != name || st.GroupRef().Own || (pool != "" && st.Pool != pool) {
			return fmt.Errorf("run %s is not of group %s (its group: %s of pool %s): compare names two attempts of one group", id, name, visibleName(cmp.Or(st.Group, "none yet")), visibleName(st.Pool))
		}
		if first != "" && st.Pool != first {
			return fmt.Errorf("runs %s and %s are of pools %s and %s: two groups that share a name", ids[0], id, first, st.Pool)
		}
		first = st.Pool
	}
	return nil
}

// compareGroup prints the table of group's runs, or with asJSON their
// dispatcher.Attempts as a JSON array.
func (a resultCmds) compareGroup(ctx context.Context, d *dispatcher.Dispatcher, group, pool string, asJSON bool) error {
	attempts, err := a.groupAttempts(ctx, d, group, pool)
	if err != nil {
		return err
	}
	if asJSON {
		b, err := json.MarshalIndent(attempts, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "%s\n", inertJSON(b))
		return err
	}
	rows := make([]compareRow, len(attempts))
	for i := range attempts {
		rows[i] = newCompareRow(&attempts[i])
	}
	return printCompare(a.stdout, rows)
}

// groupAttempts returns what compare shows of each run of group name (in
// pool, else in the one pool whose runs name it: groupRuns), in the order
// they were submitted, their test reports read.
func (a resultCmds) groupAttempts(ctx context.Context, d *dispatcher.Dispatcher, name, pool string) ([]dispatcher.Attempt, error) {
	runs, err := a.groupRuns(ctx, d, name, pool)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(runs, func(x, y messages.RunState) int { return dispatcher.SubmitOrder(&x, &y) })
	out := make([]dispatcher.Attempt, len(runs))
	for i := range runs {
		out[i] = attemptWithTests(ctx, d, &runs[i])
	}
	return out, nil
}

// groupRuns returns the runs a worker admitted to the named group name (a
// run's state names its group once admitted): those of pool, or, pool
// empty, of the one pool whose runs name the group (onePool). None is an
// error.
func (a resultCmds) groupRuns(ctx context.Context, d *dispatcher.Dispatcher, name, pool string) ([]messages.RunState, error) {
	runs, err := listRuns(ctx, d.RunStates, a.stderr, dispatcher.RunFilter{Group: name, Pool: pool})
	// A run alone in its own group (named by its id) is in no named group.
	runs = slices.DeleteFunc(runs, func(st messages.RunState) bool { return st.GroupRef().Own })
	switch {
	case err != nil:
		return nil, err
	case len(runs) == 0 && pool != "":
		return nil, fmt.Errorf("group %s of pool %s has no runs", name, pool)
	case len(runs) == 0:
		return nil, fmt.Errorf("group %s has no runs", name)
	}
	return runs, onePool(name, runs)
}

// onePool refuses, as a usage error asking for --pool, runs of group name
// in more than one pool: each is a group of its own.
func onePool(name string, runs []messages.RunState) error {
	pools := map[string]bool{}
	for i := range runs {
		pools[runs[i].Pool] = true
	}
	if len(pools) < 2 {
		return nil
	}
	names := slices.Sorted(maps.Keys(pools))
	return usageError(fmt.Errorf("group %s has runs in pools %s: each is a group of its own; give --pool", name, strings.Join(names, ", ")))
}

// resolveGroup returns group name of pool; pool empty, of the one pool
// whose runs name the group (onePool), else of the default pool. When the
// only run naming it is run name itself, the group is that run's own.
func resolveGroup(ctx context.Context, d *dispatcher.RunStates, stderr io.Writer, name, pool string) (messages.GroupRef, error) {
	runs, err := listRuns(ctx, d, stderr, dispatcher.RunFilter{Group: name, Pool: pool})
	if err != nil {
		return messages.GroupRef{}, err
	}
	g := messages.GroupRef{Pool: cmp.Or(pool, messages.DefaultPool), Name: name}
	if len(runs) == 1 && runs[0].GroupRef().Own {
		return runs[0].GroupRef(), nil
	}
	runs = slices.DeleteFunc(runs, func(st messages.RunState) bool { return st.GroupRef().Own })
	if len(runs) > 0 {
		g.Pool = runs[0].Pool
	}
	return g, onePool(name, runs)
}

// attemptWithTests is dispatcher.AttemptOf(st) with its test report read
// when the run left one.
func attemptWithTests(ctx context.Context, d *dispatcher.Dispatcher, st *messages.RunState) dispatcher.Attempt {
	at := dispatcher.AttemptOf(st)
	if dispatcher.HasTestReport(st) {
		rep, err := d.TestReport(ctx, st)
		if err != nil {
			at.TestsUnreadable = true
		} else {
			at.Tests = &rep
		}
	}
	return at
}

// compareRow is one line of compare's table, each field as printed.
type compareRow struct {
	id, profile, outcome, duration, files, insertions, deletions, tokens, cost, tests string
}

// newCompareRow says at as compare's table does: "-" for what the run
// does not have, "?" for a test report that could not be read.
func newCompareRow(at *dispatcher.Attempt) compareRow {
	r := compareRow{id: at.RunID, profile: at.Profile, duration: "-", files: "-", insertions: "-", deletions: "-", tokens: "-", cost: "-", tests: "-"}
	r.outcome = oneLine(describeOutcome(messages.Event{State: at.State, Reason: at.Reason, ExitCode: at.ExitCode}), 40)
	if at.DurationMS != nil {
		r.duration = roundDuration(time.Duration(*at.DurationMS) * time.Millisecond).String()
	}
	if at.FilesChanged != nil {
		r.files, r.insertions, r.deletions = fmt.Sprint(*at.FilesChanged), fmt.Sprintf("+%d", *at.Insertions), fmt.Sprintf("-%d", *at.Deletions)
	}
	if at.Tokens != nil {
		r.tokens = fmt.Sprint(*at.Tokens)
	}
	if at.CostUSD != nil {
		r.cost = fmt.Sprintf("$%.4f", *at.CostUSD)
	}
	switch {
	case at.TestsUnreadable:
		r.tests = "?"
	case at.Tests != nil:
		r.tests = fmt.Sprintf("%d/%d", at.Tests.Passed, at.Tests.Passed+at.Tests.Failed)
	}
	return r
}

// roundDuration rounds d for people: to 10 ms under a second, to 100 ms
// under a minute, else to the second.
func roundDuration(d time.Duration) time.Duration {
	switch {
	case d < time.Second:
		return d.Round(10 * time.Millisecond)
	case d < time.Minute:
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}

// printCompare writes compare's table; what a run chose (its reason, its
// profile's name) shown escaped.
func printCompare(w io.Writer, rows []compareRow) error {
	tw := tabwriter.NewWriter(visible(w), 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tPROFILE\tOUTCOME\tDURATION\tFILES\tINS\tDEL\tTOKENS\tCOST\tTESTS")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.id, visibleString(r.profile), visibleString(r.outcome),
			r.duration, r.files, r.insertions, r.deletions, r.tokens, r.cost, r.tests)
	}
	return tw.Flush()
}

// patchOf returns run id's patch: empty for a workspace run that changed
// nothing.
func patchOf(ctx context.Context, d *dispatcher.Dispatcher, id string) (string, error) {
	b, st, err := d.ResultObject(ctx, id, messages.ResultPatch)
	if errors.Is(err, dispatcher.ErrNoResult) && st.WorkspaceResult != nil {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("run %s: %w", id, err)
	}
	return string(b), nil
}

// interdiff writes how run a's patch and run b's differ (Interdiff).
func (a resultCmds) interdiff(ctx context.Context, d *dispatcher.Dispatcher, runA, runB string) error {
	pa, err := patchOf(ctx, d, runA)
	if err != nil {
		return err
	}
	pb, err := patchOf(ctx, d, runB)
	if err != nil {
		return err
	}
	_, err = outputWriter(a.stdout, false).Write([]byte(Interdiff(runA, runB, pa, pb)))
	return err
}

// interdiffContext is how many shared lines Interdiff shows around a
// difference.
const interdiffContext = 3

// Interdiff returns how patches a and b (git's format, of runs named
// nameA and nameB) differ: a header naming them, a line per file either
// touches ("same", "differ", "only in A", "only in B" and the file's
// "diff --git" line), then, per file that differs, its lines of a (-) and
// of b (+) with up to interdiffContext shared lines around them, longer
// runs of shared lines cut to a line "@@ N identical lines @@".
func Interdiff(nameA, nameB, a, b string) string {
	fa, fb := patchFiles(a), patchFiles(b)
	keys := make([]string, 0, len(fa)+len(fb))
	for k := range fa {
		keys = append(keys, k)
	}
	for k := range fb {
		if _, ok := fa[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out strings.Builder
	fmt.Fprintf(&out, "# interdiff: - %s, + %s\n", nameA, nameB)
	for _, k := range keys {
		sa, inA := fa[k]
		sb, inB := fb[k]
		switch {
		case !inB:
			fmt.Fprintf(&out, "only in A  %s\n", k)
		case !inA:
			fmt.Fprintf(&out, "only in B  %s\n", k)
		case sa == sb:
			fmt.Fprintf(&out, "same       %s\n", k)
		default:
			fmt.Fprintf(&out, "differ     %s\n", k)
		}
	}
	for _, k := range keys {
		sa, sb := fa[k], fb[k]
		if sa == sb {
			continue
		}
		fmt.Fprintf(&out, "\n=== %s\n", k)
		writeLineDiff(&out, sa, sb)
	}
	return out.String()
}

// patchFiles splits a patch into its files' sections, keyed by what
// follows "diff --git " on each section's first line. Text before the
// first such line is keyed "".
func patchFiles(p string) map[string]string {
	m := map[string]string{}
	key, start := "", 0
	flush := func(end int) {
		if end > start {
			m[key] += p[start:end]
		}
	}
	for i := 0; i < len(p); {
		j := strings.IndexByte(p[i:], '\n')
		next := len(p)
		if j >= 0 {
			next = i + j + 1
		}
		if rest, ok := strings.CutPrefix(p[i:next], "diff --git "); ok {
			flush(i)
			key, start = strings.TrimSuffix(rest, "\n"), i
		}
		i = next
	}
	flush(len(p))
	return m
}

// writeLineDiff writes the lines of a and b prefixed "-", "+" or " "
// (shared), shared runs longer than twice interdiffContext cut.
func writeLineDiff(out *strings.Builder, a, b string) {
	type line struct {
		op   diffmatchpatch.Operation
		text string
	}
	var lines []line
	for _, d := range diff.Do(a, b) {
		for l := range strings.Lines(d.Text) {
			lines = append(lines, line{d.Type, l})
		}
	}
	write := func(l line) {
		prefix := " "
		switch l.op {
		case diffmatchpatch.DiffDelete:
			prefix = "-"
		case diffmatchpatch.DiffInsert:
			prefix = "+"
		}
		out.WriteString(prefix + l.text)
		if !strings.HasSuffix(l.text, "\n") {
			out.WriteString("\n\\ No newline at end of file\n")
		}
	}
	for i := 0; i < len(lines); {
		if lines[i].op != diffmatchpatch.DiffEqual {
			write(lines[i])
			i++
			continue
		}
		j := i
		for j < len(lines) && lines[j].op == diffmatchpatch.DiffEqual {
			j++
		}
		head, tail := interdiffContext, interdiffContext
		if i == 0 {
			head = 0
		}
		if j == len(lines) {
			tail = 0
		}
		if j-i <= head+tail+1 {
			for _, l := range lines[i:j] {
				write(l)
			}
		} else {
			for _, l := range lines[i : i+head] {
				write(l)
			}
			fmt.Fprintf(out, "@@ %d identical lines @@\n", j-i-head-tail)
			for _, l := range lines[j-tail : j] {
				write(l)
			}
		}
		i = j
	}
}
