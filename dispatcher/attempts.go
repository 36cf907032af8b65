package dispatcher

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

	"github.com/jetcrew/jetcrew/messages"
)

// TestReportArtifact is the artifact (a path under .jetcrew/artifacts of a
// run's workspace) a run's test results are read from: a JSON object
// {"passed": N, "failed": M} (docs/workspaces.md).
const TestReportArtifact = "test-report.json"

// maxTestReport bounds the test report read, in bytes.
const maxTestReport = 64 << 10

// ErrNoTestReport: the run left no test report among its artifacts.
var ErrNoTestReport = errors.New("no test report")

// TestReport is a run's test results, from its TestReportArtifact.
type TestReport struct {
	Passed int `json:"passed"`
	Failed int `json:"failed"`
}

// Attempt is what `jetcrew compare` and the console's group page show of
// one run of a group (submit --attempts): its outcome, duration, what it
// changed and what its model usage cost. A pointer field is nil when the
// run does not have it (no workspace result, not metered, not priced). It
// is also `jetcrew compare GROUP --json`'s element (docs/cli.md).
type Attempt struct {
	RunID   string         `json:"run_id"`
	Profile string         `json:"profile"`
	State   messages.State `json:"state"`
	// Reason says why the run ended as it did; ExitCode is its process's.
	Reason   string `json:"reason,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	// DurationMS is from its container's start to its end, in
	// milliseconds; nil until it ended, or when it never started.
	DurationMS *int64 `json:"duration_ms,omitempty"`
	// FilesChanged, Insertions and Deletions are its workspace result's
	// diffstat; nil for a run without one.
	FilesChanged *int `json:"files_changed,omitempty"`
	Insertions   *int `json:"insertions,omitempty"`
	Deletions    *int `json:"deletions,omitempty"`
	// Tokens sums its metered model tokens of every kind; nil when it is
	// not metered (messages.UsageTotals).
	Tokens *int64 `json:"tokens,omitempty"`
	// CostUSD is its metered cost in US dollars; nil when not metered, or
	// when some response had no price and none had one.
	CostUSD *float64 `json:"cost_usd,omitempty"`
	// Tests is its test report; nil when it left none, or (with
	// TestsUnreadable) one that is not {"passed": N, "failed": M}.
	// Filled by Dispatcher.TestReport, not by AttemptOf.
	Tests           *TestReport `json:"tests,omitempty"`
	TestsUnreadable bool        `json:"tests_unreadable,omitempty"`
	// Bundle is true when its result has a git bundle: `jetcrew apply
	// RUN_ID` takes it.
	Bundle bool `json:"bundle"`
}

// AttemptOf returns what compare shows of run st, from its state alone (no
// read: Tests is left empty).
func AttemptOf(st *messages.RunState) Attempt {
	a := Attempt{RunID: st.ID, Profile: st.Profile, State: st.State, Reason: st.Reason, ExitCode: st.ExitCode}
	if !st.StartedAt.IsZero() && !st.FinishedAt.IsZero() {
		ms := st.FinishedAt.Sub(st.StartedAt).Milliseconds()
		a.DurationMS = &ms
	}
	if w := st.WorkspaceResult; w != nil {
		files, ins, del := w.FilesChanged, w.Insertions, w.Deletions
		a.FilesChanged, a.Insertions, a.Deletions = &files, &ins, &del
		a.Bundle = slices.ContainsFunc(w.Objects, func(o messages.ResultObject) bool {
			return strings.HasSuffix(o.Name, "/"+messages.ResultBundle)
		})
	}
	if u := st.Usage; u != nil {
		t := u.Tokens
		n := t.Input + t.Output + t.CacheRead + t.CacheWrite
		a.Tokens = &n
		if u.CostUSD > 0 || u.Unpriced == 0 && u.Requests > u.Unknown {
			c := u.CostUSD
			a.CostUSD = &c
		}
	}
	return a
}

// HasTestReport reports whether run st's workspace result lists a
// TestReportArtifact.
func HasTestReport(st *messages.RunState) bool {
	return st.WorkspaceResult != nil && slices.ContainsFunc(st.WorkspaceResult.Artifacts,
		func(o messages.ResultObject) bool { return o.Name == TestReportArtifact })
}

// SubmitOrder orders runs oldest first, as submit --attempts numbers them:
// by QueuedAt, then GROUP-2 before GROUP-10 (shorter id first), then by id.
func SubmitOrder(a, b *messages.RunState) int {
	return cmp.Or(a.QueuedAt.Compare(b.QueuedAt), cmp.Compare(len(a.ID), len(b.ID)), strings.Compare(a.ID, b.ID))
}

// TestReport reads run st's test report from its artifacts tar (at most
// 64 KiB of it). The error wraps ErrNoTestReport when the run left none,
// and says why when it is not {"passed": N, "failed": M} with N and M not
// negative.
func (res *Results) TestReport(ctx context.Context, st *messages.RunState) (TestReport, error) {
	if !HasTestReport(st) {
		return TestReport{}, fmt.Errorf("run %s: %w", st.ID, ErrNoTestReport)
	}
	rr, err := res.OpenResult(ctx, st, messages.ResultArtifacts)
	if err != nil {
		return TestReport{}, err
	}
	defer rr.Close()
	tr := tar.NewReader(rr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return TestReport{}, fmt.Errorf("run %s: %w in its artifacts tar", st.ID, ErrNoTestReport)
		}
		if err != nil {
			return TestReport{}, fmt.Errorf("run %s: artifacts: %w", st.ID, err)
		}
		if h.Name != TestReportArtifact || h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(tr, maxTestReport+1))
		if err != nil {
			return TestReport{}, fmt.Errorf("run %s: test report: %w", st.ID, err)
		}
		if len(b) > maxTestReport {
			return TestReport{}, fmt.Errorf("run %s: test report larger than %d bytes", st.ID, maxTestReport)
		}
		var rep struct {
			Passed *int `json:"passed"`
			Failed *int `json:"failed"`
		}
		if json.Unmarshal(b, &rep) != nil || rep.Passed == nil || *rep.Passed < 0 || rep.Failed != nil && *rep.Failed < 0 {
			return TestReport{}, fmt.Errorf("run %s: test report is not {\"passed\": N, \"failed\": M}", st.ID)
		}
		out := TestReport{Passed: *rep.Passed}
		if rep.Failed != nil {
			out.Failed = *rep.Failed
		}
		return out, nil
	}
}
