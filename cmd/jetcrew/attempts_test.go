package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// attemptBehaviour is a fake agent for attempt K of a group (its run id
// ends in -K): it writes answer.txt with K lines into the writable
// /workspace, leaves the test report {"passed": K, "failed": 3-K}, and
// exits 0 for K <= 2, else K-2 (attempt 3 fails with exit code 1).
func attemptBehaviour(jail.ContainerSpec) (workertest.Behaviour, error) {
	return func(_ context.Context, spec jail.ContainerSpec, _ jail.OutputFunc) jail.ExitStatus {
		id := spec.Labels[jail.LabelRunID]
		k, err := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
		if err != nil {
			return jail.ExitStatus{Code: 9}
		}
		for _, m := range spec.Mounts {
			if m.Target != messages.WorkspaceDir || m.ReadOnly {
				continue
			}
			var b strings.Builder
			for i := 1; i <= k; i++ {
				fmt.Fprintf(&b, "line %d\n", i)
			}
			arts := filepath.Join(m.Source, ".jetcrew", "artifacts")
			if os.WriteFile(filepath.Join(m.Source, "answer.txt"), []byte(b.String()), 0o644) != nil ||
				os.MkdirAll(arts, 0o755) != nil ||
				os.WriteFile(filepath.Join(arts, TestReportArtifact), fmt.Appendf(nil, `{"passed": %d, "failed": %d}`, k, 3-k), 0o644) != nil {
				return jail.ExitStatus{Code: 8}
			}
			return jail.ExitStatus{Code: max(k-2, 0)}
		}
		return jail.ExitStatus{Code: 7}
	}, nil
}

// submit --attempts 3 --workspace uploads the snapshot once and submits
// three runs naming it, in one group; --wait prints each one's finished
// line and exits 1 as one failed; compare lists them in order with their
// diffstats and test reports; compare A B shows how their patches differ;
// apply takes the second.
func TestSubmitAttemptsCompareApply(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	rt := workertest.NewTestRuntime(t)
	rt.Behave = attemptBehaviour
	startWorkerWith(t, s, rt, "--concurrency", "3")
	url := s.ClientURL()

	repo := t.TempDir()
	workertest.Git(t, repo, "init", "-q", "-b", "main")
	require.NoError(t, os.WriteFile(filepath.Join(repo, "main.go"), []byte("package main\n"), 0o644))
	workertest.Git(t, repo, "add", ".")
	workertest.Git(t, repo, "commit", "-qm", "first")

	code, stdout, stderr := cli(t, url, "submit", "--attempts", "3", "--wait", "--workspace", repo, "answer")
	require.Equal(t, 1, code, "attempt 3 fails: %s", stderr)
	m := regexp.MustCompile(`--- group ([0-9A-Z]{26}): 3 attempts \(jetcrew compare ([0-9A-Z]{26})\)`).FindStringSubmatch(stderr)
	require.NotNil(t, m, stderr)
	g := m[1]
	require.Equal(t, g, m[2])
	ids := []string{g + "-1", g + "-2", g + "-3"}
	require.Equal(t, strings.Join(ids, "\n")+"\n", stdout)
	require.Equal(t, 1, strings.Count(stderr, "--- workspace "+repo+": "), "one snapshot, uploaded once: %s", stderr)
	require.Contains(t, stderr, "--- run "+g+"-1 finished: succeeded\n")
	require.Contains(t, stderr, "--- run "+g+"-2 finished: succeeded\n")
	require.Contains(t, stderr, "--- run "+g+"-3 finished: failed (exit code 1)\n")
	require.Contains(t, stderr, "jetcrew: 1 of 3 attempts did not succeed: "+g+"-3\n")

	// Three runs, one group, one snapshot.
	js, err := jetstream.New(workertest.Connect(t, s))
	require.NoError(t, err)
	kv, err := js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	var snapshot string
	for _, id := range ids {
		e, err := kv.Get(t.Context(), id)
		require.NoError(t, err)
		var st messages.RunState
		require.NoError(t, json.Unmarshal(e.Value(), &st))
		require.Equal(t, g, st.Group)
		require.NotNil(t, st.WorkspaceResult)
		if snapshot == "" {
			snapshot = st.WorkspaceResult.Snapshot
		}
		require.Equal(t, snapshot, st.WorkspaceResult.Snapshot, "every attempt worked on the one snapshot")
	}
	require.NotEmpty(t, snapshot)
	uploads, err := js.ObjectStore(t.Context(), messages.BucketUploads)
	require.NoError(t, err)
	objs, err := uploads.List(t.Context())
	require.NoError(t, err)
	objs = slices.DeleteFunc(objs, func(o *jetstream.ObjectInfo) bool { return o.Opts != nil && o.Opts.Link != nil })
	require.Len(t, objs, 1, "one upload (streamed: the object, beside the link of its digest's name)")

	// runs --group lists them.
	code, stdout, stderr = cli(t, url, "runs", "--group", g)
	require.Equal(t, 0, code, stderr)
	for _, id := range ids {
		require.Contains(t, stdout, id+" ")
	}

	code, stdout, stderr = cli(t, url, "compare", g)
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	require.Len(t, lines, 4, stdout)
	require.Regexp(t, `^RUN +PROFILE +OUTCOME +DURATION +FILES +INS +DEL +TOKENS +COST +TESTS$`, lines[0])
	for k, want := range []string{
		`^` + g + `-1 +shell +succeeded +[0-9.]+m?s +1 +\+1 +-0 +- +- +1/3$`,
		`^` + g + `-2 +shell +succeeded +[0-9.]+m?s +1 +\+2 +-0 +- +- +2/3$`,
		`^` + g + `-3 +shell +failed \(exit code 1\) +[0-9.]+m?s +1 +\+3 +-0 +- +- +3/3$`,
	} {
		require.Regexp(t, want, lines[k+1])
	}

	code, stdout, stderr = cli(t, url, "compare", g, ids[0], ids[1])
	require.Equal(t, 0, code, stderr)
	require.True(t, strings.HasPrefix(stdout, "# interdiff: - "+ids[0]+", + "+ids[1]+"\ndiffer     a/answer.txt b/answer.txt\n"), stdout)
	require.Contains(t, stdout, "\n=== a/answer.txt b/answer.txt\n")
	require.Contains(t, stdout, "-@@ -0,0 +1 @@\n+@@ -0,0 +1,2 @@\n +line 1\n++line 2\n")
	code, _, stderr = cli(t, url, "compare", "another-group", ids[0], ids[1])
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "is not of group another-group (its group: "+g+" of pool default)")
	code, _, stderr = cli(t, url, "compare", "--pool", "gpu", g, ids[0], ids[1])
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "is not of group "+g)

	// --json: the same attempts, as data.
	code, stdout, stderr = cli(t, url, "compare", "--json", g)
	require.Equal(t, 0, code, stderr)
	var attempts []dispatcher.Attempt
	require.NoError(t, json.Unmarshal([]byte(stdout), &attempts), stdout)
	require.Len(t, attempts, 3)
	for k, at := range attempts {
		require.Equal(t, ids[k], at.RunID)
		require.Equal(t, "shell", at.Profile)
		require.Equal(t, 1, *at.FilesChanged)
		require.Equal(t, k+1, *at.Insertions)
		require.Equal(t, 0, *at.Deletions)
		require.Equal(t, &dispatcher.TestReport{Passed: k + 1, Failed: 2 - k}, at.Tests)
		require.NotNil(t, at.DurationMS)
		require.Nil(t, at.Tokens, "not metered")
		require.True(t, at.Bundle)
	}
	require.Equal(t, messages.StateFailed, attempts[2].State)
	require.Equal(t, 1, *attempts[2].ExitCode)
	code, _, stderr = cli(t, url, "compare", "--json", g, ids[0], ids[1])
	require.Equal(t, exitUsage, code, stderr)

	code, stdout, stderr = cli(t, url, "apply", "--repo", repo, ids[1])
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "branch jetcrew/"+ids[1]+" at ")
	require.Equal(t, "line 1\nline 2", workertest.Git(t, repo, "show", "jetcrew/"+ids[1]+":answer.txt"))
}

// --profiles spreads the attempts over the profiles in turn, --id names
// the runs and the group; the ids and the group are printed.
func TestSubmitAttemptsProfiles(t *testing.T) {
	t.Parallel()
	s, js := provisionedServer(t)
	url := s.ClientURL()
	code, stdout, stderr := cli(t, url, "submit", "--id", "try", "--attempts", "3", "--profiles", "shell,other", "out hi")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "try-1\ntry-2\ntry-3\n", stdout)
	require.Contains(t, stderr, "--- group try: 3 attempts (jetcrew compare try)\n")
	runs, err := js.Stream(t.Context(), messages.StreamRuns)
	require.NoError(t, err)
	for seq, want := range []string{"shell", "other", "shell"} {
		msg, err := runs.GetMsg(t.Context(), uint64(seq+1))
		require.NoError(t, err)
		req, err := messages.DecodeRunRequest(msg.Data)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("try-%d", seq+1), req.ID)
		require.Equal(t, want, req.Profile)
		require.Equal(t, "try", req.Group)
	}

	// Without --attempts, one attempt per profile, in the group asked for.
	startWorker(t, s)
	code, stdout, stderr = cli(t, url, "submit", "--id", "pp", "--group", "grp", "--profiles", "shell,shell", "out hi")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "pp-1\npp-2\n", stdout)
	require.Contains(t, stderr, "--- group grp: 2 attempts")
	require.Eventually(t, func() bool {
		code, stdout, _ := cli(t, url, "compare", "grp")
		return code == 0 && strings.Count(stdout, " succeeded ") == 2
	}, 20*time.Second, 50*time.Millisecond)
}

// A mistake in --attempts, --profiles or --id is a usage error before
// anything connects.
func TestSubmitAttemptsUsage(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", messages.MaxTokenLen-1)
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"too many", []string{"--attempts", "17"}, "--attempts 17: give 1 to 16"},
		{"negative", []string{"--attempts", "-1"}, "--attempts -1: give 1 to 16"},
		{"profile and profiles", []string{"--attempts", "2", "--profile", "shell", "--profiles", "a,b"}, "--profile and --profiles both given"},
		{"empty profile", []string{"--profiles", "a,,b"}, "an empty profile name"},
		{"id too long for its suffix", []string{"--attempts", "2", "--id", long}, "the runs are ID-1 to ID-2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := cli(t, "nats://127.0.0.1:1", append(append([]string{"submit"}, tt.args...), "out hi")...)
			require.Equal(t, exitUsage, code, stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tt.want)
			require.NotContains(t, stderr, "connect")
		})
	}
	for _, args := range [][]string{{"compare"}, {"compare", "g", "a"}, {"compare", "g", "a", "b", "c"}, {"compare", "a.b"}} {
		code, _, stderr := cli(t, "nats://127.0.0.1:1", args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, stderr)
	}
}

// compare's line for a run says its tokens (every kind) and cost where its
// proxy metered them, and "-" for what it does not have.
func TestCompareRow(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	st := messages.RunState{ID: "g-1", Profile: "claude", State: messages.StateSucceeded, StartedAt: start, FinishedAt: start.Add(83 * time.Second),
		Usage:           &messages.UsageTotals{Requests: 3, Tokens: messages.Tokens{Input: 100, Output: 20, CacheRead: 5}, CostUSD: 0.0125},
		WorkspaceResult: &messages.WorkspaceResult{FilesChanged: 2, Insertions: 10, Deletions: 4}}
	require.Equal(t, compareRow{id: "g-1", profile: "claude", outcome: "succeeded", duration: "1m23s", files: "2", insertions: "+10",
		deletions: "-4", tokens: "125", cost: "$0.0125", tests: "-"}, compareOf(&st))
	q := messages.RunState{ID: "g-2", Profile: "x\x1b[2J", State: messages.StateQueued}
	require.Equal(t, compareRow{id: "g-2", profile: "x\x1b[2J", outcome: "queued", duration: "-", files: "-", insertions: "-",
		deletions: "-", tokens: "-", cost: "-", tests: "-"}, compareOf(&q))
	bad := dispatcher.AttemptOf(&q)
	bad.TestsUnreadable = true
	require.Equal(t, "?", newCompareRow(&bad).tests)
	var b strings.Builder
	require.NoError(t, printCompare(&b, []compareRow{compareOf(&q)}))
	requireInert(t, b.String())
}

func compareOf(st *messages.RunState) compareRow {
	at := dispatcher.AttemptOf(st)
	return newCompareRow(&at)
}

// Interdiff lists each file either patch touches and shows the lines
// where they differ, long shared runs cut.
func TestInterdiff(t *testing.T) {
	t.Parallel()
	same := "diff --git a/same.txt b/same.txt\n--- a/same.txt\n+++ b/same.txt\n@@ -1 +1 @@\n-a\n+b\n"
	var shared strings.Builder
	for i := range 10 {
		fmt.Fprintf(&shared, "+s%d\n", i)
	}
	a := same + "diff --git a/f.txt b/f.txt\n--- a/f.txt\n+++ b/f.txt\n@@ -0,0 +1,11 @@\n" + shared.String() + "+end A\n" +
		"diff --git a/onlya b/onlya\n+x\n"
	b := "diff --git a/f.txt b/f.txt\n--- a/f.txt\n+++ b/f.txt\n@@ -0,0 +1,11 @@\n" + shared.String() + "+end B\n" + same +
		"diff --git a/onlyb b/onlyb\n+y"
	require.Equal(t, "# interdiff: - A, + B\n"+
		"differ     a/f.txt b/f.txt\n"+
		"only in A  a/onlya b/onlya\n"+
		"only in B  a/onlyb b/onlyb\n"+
		"same       a/same.txt b/same.txt\n"+
		"\n=== a/f.txt b/f.txt\n"+
		"@@ 11 identical lines @@\n"+
		" +s7\n +s8\n +s9\n-+end A\n++end B\n"+
		"\n=== a/onlya b/onlya\n-diff --git a/onlya b/onlya\n-+x\n"+
		"\n=== a/onlyb b/onlyb\n+diff --git a/onlyb b/onlyb\n++y\n\\ No newline at end of file\n",
		Interdiff("A", "B", a, b))
}
