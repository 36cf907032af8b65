package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// failFirstRuntime is a fake runtime whose first container of each run
// exits 3; later ones run their prompt as a workertest script.
func failFirstRuntime(t testing.TB) *workertest.Runtime {
	rt := workertest.NewTestRuntime(t)
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
	)
	rt.Behave = func(spec jail.ContainerSpec) (workertest.Behaviour, error) {
		id := spec.Labels[jail.LabelRunID]
		mu.Lock()
		first := !seen[id]
		seen[id] = true
		mu.Unlock()
		if first {
			return func(context.Context, jail.ContainerSpec, jail.OutputFunc) jail.ExitStatus {
				return jail.ExitStatus{Code: 3}
			}, nil
		}
		return workertest.ScriptBehaviour(spec)
	}
	return rt
}

// plainShellProfiles writes a profile file whose shell profile has
// coordination off, and returns its path. These tests are about the CLI,
// and a replay right after the failure meets the failed delivery's
// coordination session and run directory, which outlive its request (a
// worker issue).
func plainShellProfiles(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "profiles.toml")
	require.NoError(t, os.WriteFile(path, []byte(`[profiles.shell]
image        = "jetcrew-sandbox:latest"
command      = ["/bin/sh", "-c", "{prompt}"]
coordination = false
`), 0o644))
	return path
}

func TestFailedAndReplay(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	rt := failFirstRuntime(t)
	startWorkerWith(t, s, rt, "--id", "replay-worker", "--profiles", plainShellProfiles(t))
	url := s.ClientURL()

	code, _, stderr := cli(t, url, "failed")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "no dead letters")

	code, _, _ = cli(t, url, "submit", "--wait", "--id", "flaky", "out second time lucky")
	require.Equal(t, 3, code)

	// The dead letter is stored just after the finished event.
	var stdout string
	require.Eventually(t, func() bool {
		code, stdout, stderr = cli(t, url, "failed")
		return code == 0 && strings.Contains(stdout, "flaky")
	}, 5*time.Second, 20*time.Millisecond, "stderr: %s", stderr)
	require.Regexp(t, `SEQ\s+TIME\s+POOL\s+RUN ID\s+STATE\s+EXIT\s+ATTEMPTS\s+NOW\s+REASON`, stdout)
	require.Regexp(t, `default\s+flaky\s+failed\s+3\s+1\s+failing\s+exit code 3`, stdout)

	code, stdout, stderr = cli(t, url, "failed", "--json", "--pool", "default")
	require.Equal(t, 0, code, stderr)
	var entries []failedEntry
	require.NoError(t, json.Unmarshal([]byte(stdout), &entries), stdout)
	require.Len(t, entries, 1)
	e := entries[0]
	require.Equal(t, "flaky", e.RunID)
	require.Equal(t, messages.StateFailed, e.State)
	require.Equal(t, 3, *e.ExitCode)
	require.Equal(t, 1, e.Attempts)
	require.Equal(t, "exit code 3", e.Reason)
	require.Equal(t, "replay-worker", e.Worker)
	require.JSONEq(t, `{"version":1,"id":"flaky","profile":"shell","prompt":"out second time lucky","pool":"default"}`, string(e.Request))

	code, stdout, stderr = cli(t, url, "failed", "--pool", "other")
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stdout)

	// Archive puts the dead letter aside (listed with --all only);
	// unarchive brings it back.
	code, _, stderr = cli(t, url, "failed", "archive", "flaky")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "archived the dead letters of run flaky")
	code, stdout, stderr = cli(t, url, "failed")
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, stdout, "flaky")
	require.Contains(t, stderr, "1 archived dead letter(s) not listed")
	code, stdout, _ = cli(t, url, "failed", "--all")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "failing, archived")
	code, _, stderr = cli(t, url, "failed", "unarchive", "flaky")
	require.Equal(t, 0, code, stderr)
	code, stdout, _ = cli(t, url, "failed", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, `"run_id": "flaky"`)
	require.NotContains(t, stdout, `"archived"`)
	code, _, stderr = cli(t, url, "failed", "archive", "nope")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "no dead letter")

	// replay --wait follows the replayed run only, and exits with its
	// outcome. (Once the failed run's container is gone: a replay that comes
	// first finds the container name taken and is retried.)
	require.Eventually(t, func() bool { return rt.Live() == 0 }, 5*time.Second, 10*time.Millisecond)
	code, stdout, stderr = cli(t, url, "replay", "--wait", "flaky")
	require.Equal(t, 0, code, "stderr: %s", stderr)
	require.Equal(t, "second time lucky\n", stdout)
	require.Regexp(t, `--- replayed run flaky: dead letter \d+ \(failed, exit code 3\) published to jetcrew.runs.default.replay as JETCREW_RUNS sequence \d+`, stderr)
	require.Contains(t, stderr, "--- finished: succeeded")
	require.NotContains(t, stderr, "failed (exit code 3)\n", "the failed run's events are not replayed")

	code, stdout, _ = cli(t, url, "status", "flaky")
	require.Equal(t, 0, code)
	require.Regexp(t, `replays:\s+1`, stdout)

	// Healed: resolved, listed only with --all (issue 27).
	code, stdout, stderr = cli(t, url, "failed")
	require.Equal(t, 0, code)
	require.NotContains(t, stdout, "flaky")
	require.Contains(t, stderr, "1 resolved dead letter(s) not listed")
	code, stdout, _ = cli(t, url, "failed", "--all")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "healed (replays: 1)")
	code, stdout, _ = cli(t, url, "failed", "--all", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, `"fate": "healed"`)

	// A run that succeeded is refused, visibly.
	code, stdout, stderr = cli(t, url, "replay", "flaky")
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "replay refused")
	require.Contains(t, stderr, "already succeeded")

	code, _, stderr = cli(t, url, "replay", "nope")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "no dead letter")

	// Discard deletes the run's dead letters.
	code, _, stderr = cli(t, url, "failed", "discard", "flaky")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "discarded 1 dead letter(s) of run flaky")
	code, stdout, stderr = cli(t, url, "failed", "--all")
	require.Equal(t, 0, code)
	require.NotContains(t, stdout, "flaky")
	require.Contains(t, stderr, "no dead letters")
	code, _, stderr = cli(t, url, "failed", "discard", "flaky")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "no dead letter")
}

func TestReplayWithoutWait(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	rt := failFirstRuntime(t)
	startWorkerWith(t, s, rt, "--profiles", plainShellProfiles(t))
	url := s.ClientURL()

	code, _, _ := cli(t, url, "submit", "--wait", "--id", "r", "out ok")
	require.Equal(t, 3, code)
	require.Eventually(t, func() bool { return rt.Live() == 0 }, 5*time.Second, 10*time.Millisecond)
	code, stdout, stderr := cli(t, url, "replay", "r")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^replayed run r: dead letter \d+ .* JETCREW_RUNS sequence \d+\n$`, stdout)
	var last string
	ok := assert.Eventually(t, func() bool {
		code, stdout, _ := cli(t, url, "status", "--json", "r")
		last = stdout
		var st messages.RunState
		return code == 0 && json.Unmarshal([]byte(stdout), &st) == nil && st.State == messages.StateSucceeded && st.Replays == 1
	}, 10*time.Second, 20*time.Millisecond)
	if !ok {
		_, events, _ := cli(t, url, "watch", "r")
		t.Fatalf("last state: %s\nwatch: %s", last, events)
	}
}

func TestCancelCommand(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	startWorkerWith(t, s, workertest.NewTestRuntime(t), "--concurrency", "1", "--id", "cancel-worker")
	url := s.ClientURL()

	code, stdout, stderr := cli(t, url, "submit", "--id", "long", "sleep 1m")
	require.Equal(t, 0, code, stderr)
	require.Eventually(t, func() bool {
		_, stdout, _ := cli(t, url, "status", "long")
		return strings.Contains(stdout, "running")
	}, 10*time.Second, 20*time.Millisecond)
	code, _, stderr = cli(t, url, "submit", "--id", "waiting", "out never")
	require.Equal(t, 0, code, stderr)

	code, stdout, stderr = cli(t, url, "cancel", "waiting")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^run waiting cancelled: .*\n$`, stdout)

	code, stdout, stderr = cli(t, url, "cancel", "long")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^run long stopping: .* \(worker cancel-worker\)\n$`, stdout)

	code, _, stderr = cli(t, url, "watch", "long")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "--- cancel: cancel requested")
	require.Contains(t, stderr, "--- finished: cancelled (cancelled by request)")

	code, stdout, _ = cli(t, url, "cancel", "long")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "already_final")
}

func TestCancelNoWorker(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	code, stdout, stderr := cli(t, s.ClientURL(), "cancel", "r1")
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "no worker answered")
}

func TestWorkerFlagsReachTheConsumer(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	startWorkerWith(t, s, workertest.NewTestRuntime(t), "--ack-wait", "4s", "--max-deliver", "3",
		"--orphan-grace", "5s", "--reconcile-interval", "10s")
	nc := workertest.Connect(t, s)
	code, _, _ := cli(t, s.ClientURL(), "failed")
	require.Equal(t, 0, code)
	info := consumerInfo(t, nc)
	require.Equal(t, 4*time.Second, info.Config.AckWait)
	require.Equal(t, 3, info.Config.MaxDeliver)
}

func TestOperatorUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"cancel"}, "missing argument RUN_ID"},
		{[]string{"cancel", "a.b"}, "run id"},
		{[]string{"replay", "a b"}, "run id"},
		{[]string{"replay", "x", "y"}, "want the argument(s) RUN_ID"},
		{[]string{"failed", "x"}, "unexpected argument"},
		{[]string{"failed", "discard"}, "missing argument RUN_ID"},
		{[]string{"failed", "discard", "a.b"}, "run id"},
		{[]string{"failed", "archive"}, "missing argument RUN_ID"},
		{[]string{"failed", "unarchive", "a.b"}, "run id"},
		{[]string{"failed", "--pool", "a.b"}, "--pool"},
		{[]string{"worker", "--ack-wait", "10ms"}, "--ack-wait"},
		{[]string{"worker", "--max-deliver", "0"}, "--max-deliver"},
		{[]string{"up", "--orphan-grace", "0s"}, "--orphan-grace"},
		{[]string{"up", "--reconcile-interval", "-1s"}, "--reconcile-interval"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := cli(t, "nats://127.0.0.1:1", tt.args...)
			require.Equal(t, exitUsage, code, "stderr: %s", stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tt.want)
			require.NotContains(t, stderr, "connect to NATS")
		})
	}
}
