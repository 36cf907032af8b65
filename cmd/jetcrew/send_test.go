package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// send's exit code says what became of a steer: queued for a running run
// whose CLI takes no streamed input (the shell profile), refused once the
// run has ended, and for text that breaks a rule; a retry with the same id
// is answered the same.
func TestSendCommand(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	startWorkerWith(t, s, workertest.NewTestRuntime(t), "--concurrency", "1", "--id", "send-worker")
	url := s.ClientURL()

	code, _, stderr := cli(t, url, "send", "nobody", "hello")
	require.Equal(t, exitSteerRefused, code, stderr)

	code, _, stderr = cli(t, url, "submit", "--id", "long", "sleep 1m")
	require.Equal(t, 0, code, stderr)
	require.Eventually(t, func() bool {
		_, stdout, _ := cli(t, url, "status", "long")
		return strings.Contains(stdout, "running")
	}, 10*time.Second, 20*time.Millisecond)

	code, stdout, stderr := cli(t, url, "send", "--id", "s1", "long", "look at the tests first")
	require.Equal(t, exitSteerQueued, code, stderr)
	require.Regexp(t, `^run long: steer s1 queued, inbox message \d+: the run's agent CLI takes no input while it runs`, stdout)

	code, stdout, _ = cli(t, url, "send", "--json", "--id", "s1", "long", "look at the tests first")
	require.Equal(t, exitSteerQueued, code)
	var r messages.SteerReply
	require.NoError(t, json.Unmarshal([]byte(stdout), &r))
	require.True(t, r.Duplicate)

	code, stdout, _ = cli(t, url, "send", "long", strings.Repeat("x", messages.MaxSteerBytes+1))
	require.Equal(t, exitSteerRefused, code)
	require.Contains(t, stdout, "refused (too_large)")

	code, _, stderr = cli(t, url, "send", "--id", "a.b", "long", "x")
	require.Equal(t, exitUsage, code, stderr)

	code, _, stderr = cli(t, url, "cancel", "long")
	require.Equal(t, 0, code, stderr)
	require.Eventually(t, func() bool {
		_, stdout, _ := cli(t, url, "status", "long")
		return strings.Contains(stdout, "cancelled")
	}, 10*time.Second, 20*time.Millisecond)
	code, stdout, _ = cli(t, url, "send", "long", "too late")
	require.Equal(t, exitSteerRefused, code)
	require.Contains(t, stdout, "refused (ended): run long has ended (cancelled)")
}
