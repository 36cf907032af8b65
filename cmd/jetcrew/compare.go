package main

import (
	"archive/tar"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// TestReportArtifact is the artifact (a path under .jetcrew/artifacts of
// the run's workspace) compare reads a run's test results from: a JSON
// object {"passed": N, "failed": M} (docs/workspaces.md).
const TestReportArtifact = "test-report.json"

// maxTestReport bounds the test report compare reads, in bytes.
const maxTestReport = 64 << 10

func (a *app) compareCmd() *cobra.Command {
	var url string
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
run does not have.

With two run ids it prints how their patches differ instead (an interdiff):
a line per file either patch touches (same, differ, only in A, only in B),
then for each file that differs the lines of A's patch (-) and B's (+)
around the lines they share. Like diff, it is exact when piped and shown
escaped on a terminal. Take an attempt with "jetcrew apply RUN_ID".`,
		Example: `  jetcrew compare 01JF3Z6W8Q2ZP6C7V8N9Q0R1ST
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
			d, closeNATS, err := a.dispatcher(a.natsURL(url), "jetcrew compare")
			if err != nil {
				return err
			}
			defer closeNATS()
			if len(args) == 3 {
				for _, id := range args[1:] {
					st, err := d.Status(cmd.Context(), id)
					if err != nil {
						return fmt.Errorf("run %s: %w", id, err)
					}
					if g := cmp.Or(st.Group, st.ID); g != args[0] {
						return fmt.Errorf("run %s is of group %s, not %s: compare names two attempts of one group", id, visibleName(g), args[0])
					}
				}
				return a.interdiff(cmd.Context(), d, args[1], args[2])
			}
			return a.compareGroup(cmd.Context(), d, args[0])
		},
	}
	natsFlag(cmd, &url)
	return cmd
}

// compareGroup prints the table of group's runs.
func (a *app) compareGroup(ctx context.Context, d *dispatcher.Dispatcher, group string) error {
	runs, err := a.listRuns(ctx, d, dispatcher.RunFilter{Group: group})
	if err != nil {
		return err
	}
	if len(runs) == 0 {
		return fmt.Errorf("group %s has no runs", group)
	}
	slices.SortFunc(runs, submitOrder)
	rows := make([]compareRow, len(runs))
	for i := range runs {
		rows[i] = a.compareRow(ctx, d, &runs[i])
	}
	return printCompare(a.stdout, rows)
}

// submitOrder orders runs oldest first: by QueuedAt, then GROUP-2 before
// GROUP-10 (shorter id first), then by id.
func submitOrder(a, b messages.RunState) int {
	return cmp.Or(a.QueuedAt.Compare(b.QueuedAt), cmp.Compare(len(a.ID), len(b.ID)), strings.Compare(a.ID, b.ID))
}

// compareRow is one line of compare's table, each field as printed.
type compareRow struct {
	id, profile, outcome, duration, files, insertions, deletions, tokens, cost, tests string
}

// compareRow reads what compare shows of run st: from its state, and its
// test report from its artifacts when it left one.
func (a *app) compareRow(ctx context.Context, d *dispatcher.Dispatcher, st *messages.RunState) compareRow {
	r := compareRow{id: st.ID, profile: st.Profile, duration: "-", files: "-", insertions: "-", deletions: "-", tokens: "-", cost: "-", tests: "-"}
	r.outcome = oneLine(describeOutcome(messages.Event{State: st.State, Reason: st.Reason, ExitCode: st.ExitCode}), 40)
	if !st.StartedAt.IsZero() && !st.FinishedAt.IsZero() {
		r.duration = roundDuration(st.FinishedAt.Sub(st.StartedAt)).String()
	}
	if w := st.WorkspaceResult; w != nil {
		r.files, r.insertions, r.deletions = fmt.Sprint(w.FilesChanged), fmt.Sprintf("+%d", w.Insertions), fmt.Sprintf("-%d", w.Deletions)
		if slices.ContainsFunc(w.Artifacts, func(o messages.ResultObject) bool { return o.Name == TestReportArtifact }) {
			r.tests = a.testReport(ctx, d, st)
		}
	}
	if u := st.Usage; u != nil {
		t := u.Tokens
		r.tokens = fmt.Sprint(t.Input + t.Output + t.CacheRead + t.CacheWrite)
		if u.CostUSD > 0 || u.Unpriced == 0 && u.Requests > u.Unknown {
			r.cost = fmt.Sprintf("$%.4f", u.CostUSD)
		}
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

// testReport returns run st's test report as passed/total, read from its
// artifacts; "?" when it cannot be read or is not {"passed": N, "failed":
// M} with N and M not negative.
func (a *app) testReport(ctx context.Context, d *dispatcher.Dispatcher, st *messages.RunState) string {
	rr, err := d.OpenResult(ctx, st, messages.ResultArtifacts)
	if err != nil {
		return "?"
	}
	defer rr.Close()
	tr := tar.NewReader(rr)
	for {
		h, err := tr.Next()
		if err != nil {
			return "?"
		}
		if h.Name != TestReportArtifact || h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(tr, maxTestReport+1))
		if err != nil || len(b) > maxTestReport {
			return "?"
		}
		var rep struct {
			Passed *int `json:"passed"`
			Failed *int `json:"failed"`
		}
		if json.Unmarshal(b, &rep) != nil || rep.Passed == nil || *rep.Passed < 0 || rep.Failed != nil && *rep.Failed < 0 {
			return "?"
		}
		failed := 0
		if rep.Failed != nil {
			failed = *rep.Failed
		}
		return fmt.Sprintf("%d/%d", *rep.Passed, *rep.Passed+failed)
	}
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
func (a *app) interdiff(ctx context.Context, d *dispatcher.Dispatcher, runA, runB string) error {
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
