package tests

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// attemptScript is the prompt of every attempt: attempt K (its run id
// ends in -K) writes answer.txt with K lines, a test report of K passed
// and 3-K failed, and fails with exit code 1 when K is 3.
const attemptScript = `n=${JETCREW_RUN_ID##*-}; i=1; while [ $i -le $n ]; do echo line $i; i=$((i+1)); done > answer.txt; ` +
	`mkdir -p .jetcrew/artifacts; echo "{\"passed\": $n, \"failed\": $((3-n))}" > .jetcrew/artifacts/test-report.json; [ $n -lt 3 ]`

// TestWorkspaceAttempts is issue 28's "N attempts, compared, one picked"
// on real parts: --attempts 3 gives three runs in one group on one
// uploaded snapshot, compare (as the submitter, under --auth too) lists
// them with their diffstats and test reports, compare A B shows how their
// patches differ, and apply takes the second.
func TestWorkspaceAttempts(t *testing.T) {
	needsDocker(t)
	for _, mode := range authModes {
		t.Run(mode.name, func(t *testing.T) { testWorkspaceAttempts(t, mode.args) })
	}
}

func testWorkspaceAttempts(t *testing.T, upArgs []string) {
	url := up(t, slices.Clone(upArgs)...)
	repo := t.TempDir()
	git(t, repo, "init", "-q", "-b", "main")
	require.NoError(t, os.WriteFile(filepath.Join(repo, "main.go"), []byte("package main\n"), 0o644))
	git(t, repo, "add", "-A")
	git(t, repo, "commit", "-qm", "start")

	r := run(t, url, jetcrewBin, "submit", "--id", "try", "--attempts", "3", "--wait", "--workspace", repo, attemptScript)
	require.Equal(t, 1, r.code, "attempt 3 fails: stdout=%s stderr=%s", r.stdout, r.stderr)
	require.Equal(t, "try-1\ntry-2\ntry-3\n", r.stdout)
	require.Equal(t, 1, strings.Count(r.stderr, "--- workspace "+repo+": "), r.stderr)
	require.Contains(t, r.stderr, "--- group try: 3 attempts (jetcrew compare try)\n")
	require.Contains(t, r.stderr, "--- run try-3 finished: failed (exit code 1)\n")
	var snapshot string
	for _, id := range []string{"try-1", "try-2", "try-3"} {
		st := status(t, url, id)
		require.Equal(t, "try", st.Group)
		require.NotNil(t, st.WorkspaceResult, id)
		if snapshot == "" {
			snapshot = st.WorkspaceResult.Snapshot
		}
		require.Equal(t, snapshot, st.WorkspaceResult.Snapshot)
		if id != "try-3" {
			require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
		}
	}

	asSubmitter := func(args ...string) (string, string, int) {
		cmd := exec.Command(jetcrewBin, args...)
		cmd.Dir = repo
		cmd.Env = append(append(os.Environ(), "NATS_URL="+url), authEnv(url, "submitter")...)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		return o.String(), e.String(), code
	}
	out, errOut, code := asSubmitter("compare", "try")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 4, out)
	for k, want := range []string{
		`^try-1 +shell +succeeded +[0-9.]+m?s +1 +\+1 +-0 +- +- +1/3$`,
		`^try-2 +shell +succeeded +[0-9.]+m?s +1 +\+2 +-0 +- +- +2/3$`,
		`^try-3 +shell +failed \(exit code 1\) +[0-9.]+m?s +1 +\+3 +-0 +- +- +3/3$`,
	} {
		require.Regexp(t, regexp.MustCompile(want), lines[k+1])
	}

	out, errOut, code = asSubmitter("compare", "try", "try-1", "try-2")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "differ     a/answer.txt b/answer.txt\n")
	require.Contains(t, out, " +line 1\n++line 2\n")

	out, errOut, code = asSubmitter("apply", "try-2")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "branch jetcrew/try-2")
	require.Equal(t, "line 1\nline 2", git(t, repo, "show", "jetcrew/try-2:answer.txt"))
}
