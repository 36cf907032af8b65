package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

func TestRunsCommand(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	startWorker(t, s)
	url := s.ClientURL()

	code, stdout, stderr := cli(t, url, "runs")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "ID  STATE  POOL  PROFILE  GROUP  QUEUED  REASON\n", stdout, "an empty bucket lists nothing")

	for _, args := range [][]string{
		{"submit", "--wait", "--id", "ok1", "--label", "team=a", "out ok"},
		{"submit", "--wait", "--id", "bad1", "--label", "team=b", "exit 3"},
		{"submit", "--wait", "--id", "ok2", "--group", "g1", "--label", "team=a", "out ok"},
	} {
		cli(t, url, args...)
	}

	code, stdout, stderr = cli(t, url, "runs")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 4)
	require.True(t, strings.HasPrefix(lines[1], "ok2 "), "newest first: %s", stdout)
	require.Contains(t, lines[1], " g1 ")
	require.Contains(t, stdout, "exit code 3")

	list := func(args ...string) []string {
		code, stdout, stderr := cli(t, url, append([]string{"runs", "--json"}, args...)...)
		require.Equal(t, 0, code, stderr)
		var runs []messages.RunState
		require.NoError(t, json.Unmarshal([]byte(stdout), &runs))
		ids := []string{}
		for _, r := range runs {
			ids = append(ids, r.ID)
		}
		return ids
	}
	require.Equal(t, []string{"bad1"}, list("--state", "failed"))
	require.Equal(t, []string{"ok2", "ok1"}, list("--label", "team=a"))
	require.Equal(t, []string{"ok2"}, list("--label", "team=a", "--group", "g1"))
	require.Equal(t, []string{"ok2"}, list("--limit", "1"))
	require.Empty(t, list("--pool", "nope"))
	// Issue 27: a search over id, group, labels and reason, any case; any failure.
	require.Equal(t, []string{"bad1"}, list("--search", "EXIT CODE"))
	require.Equal(t, []string{"ok2", "ok1"}, list("--search", "Team=A"))
	require.Equal(t, []string{"ok2"}, list("--search", "g1"))
	require.Equal(t, []string{"bad1"}, list("--search", "BAD"))
	require.Equal(t, []string{"bad1"}, list("--state", "failure"))
	require.Empty(t, list("--state", "failure", "--search", "ok"))
	require.Regexp(t, `(?m)^ok1\s+succeeded\s+default\s+shell\s+-\s`, stdout, "a run without a group shows -")

	code, _, stderr = cli(t, url, "runs", "--state", "nope")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "not a run state")
	code, _, stderr = cli(t, url, "runs", "--label", "novalue")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "want key=value")
}

func TestVersion(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := cli(t, "", "--version")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^jetcrew \S+ .*go1\.\d+`, stdout)
}

// Issue 27, bug 1: a run no worker has taken (its request waits in
// JETCREW_RUNS, a submitter writes no state) is listed queued, with its
// place in the pool's queue, and `status` says so.
func TestRunsListsQueued(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	startWorker(t, s)
	url := s.ClientURL()
	for _, id := range []string{"q1", "q2"} {
		code, _, stderr := cli(t, url, "submit", "--pool", "later", "--id", id, "--label", "team=a", "out "+id)
		require.Equal(t, 0, code, stderr)
	}

	code, stdout, stderr := cli(t, url, "runs")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^q2 +queued +later +.*waiting for a worker: 2 in pool later's queue$`, stdout)
	require.Regexp(t, `(?m)^q1 +queued +later +.*waiting for a worker: 1 in pool later's queue$`, stdout)
	code, stdout, stderr = cli(t, url, "runs", "--json", "--state", "queued", "--label", "team=a")
	require.Equal(t, 0, code, stderr)
	var runs []messages.RunState
	require.NoError(t, json.Unmarshal([]byte(stdout), &runs))
	require.Len(t, runs, 2)
	require.Equal(t, "q2", runs[0].ID, "newest first")
	require.Equal(t, map[string]string{"team": "a"}, runs[0].Labels)

	code, stdout, stderr = cli(t, url, "status", "q1")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^state: +queued$`, stdout)
	require.Contains(t, stdout, "waiting for a worker of pool later")
	code, _, _ = cli(t, url, "status", "nosuch")
	require.Equal(t, 1, code)
}
