package tests

// Issue 13 ("Hardening"), proven through the real worker on a real Docker
// engine: what a run can make the worker spend, and final states that tell
// one story.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
)

// TestJailChildOOMConsistent: a subshell fills the memory limit and is
// OOM-killed, the main shell prints "survived" and exits 0 (issue 13 item
// 21). The outcome follows the main process: succeeded, exit code 0, no
// reason, and the state and finished event carry oom_killed. A main process
// killed at the limit stays failed, reason "oom", exit 137
// (TestJailMemoryOOM).
func TestJailChildOOMConsistent(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	b := startJail(t, jailProfile("tight", "memory_mib = 32"), nil)

	st, out := b.runScript(t, "childoom", "tight",
		`(x=aaaaaaaaaaaaaaaa; while :; do x=$x$x; done); echo survived`)
	require.Equal(t, messages.StateSucceeded, st.State, "reason %q", st.Reason)
	require.Empty(t, st.Reason)
	require.NotNil(t, st.ExitCode)
	require.Equal(t, 0, *st.ExitCode)
	require.True(t, st.OOMKilled, "the state says an OOM kill happened")
	require.Equal(t, "survived\n", string(out.stdout))

	fin := finishedEvent(t, b, "childoom")
	require.Equal(t, messages.StateSucceeded, fin.State)
	require.Equal(t, 0, *fin.ExitCode)
	require.True(t, fin.OOMKilled, "the finished event says an OOM kill happened")
}

// TestJailOutputBudget: a run writing 5 MB under max_output_mib = 1 goes
// on to succeed; 1 MiB of its output is published, the rest counted in
// output_dropped_bytes (issue 13 item 2).
func TestJailOutputBudget(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	b := startJail(t, jailProfile("small", "max_output_mib = 1"), nil)

	st, out := b.runScript(t, "budget", "small", `head -c 5000000 /dev/zero; echo done >&2`)
	require.Equal(t, messages.StateSucceeded, st.State, "reason %q", st.Reason)
	require.EqualValues(t, 1<<20, st.OutputBytes)
	require.EqualValues(t, 5000000+5-(1<<20), st.OutputDroppedBytes)
	require.Len(t, out.stdout, 1<<20)
	require.Empty(t, out.stderr, "past the budget, stderr is dropped too")
}

// TestJailSecretsMasked: a run under a profile with env_from_host = ["KEY"]
// prints its key, whole and split across two writes 300 ms apart (so two
// output chunks), and fails (issue 13 item 12). The value appears in none
// of: its output events, its state's reason, its dead letter's headers, its
// finished event, the worker's log; "***" stands in its place.
func TestJailSecretsMasked(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	const secret = "sk-live-7f3a9c21e4"
	logs := &lockedBuffer{}
	b := startJail(t, jailProfile("keyed", `env_from_host = ["KEY"]`), func(c *worker.Config) {
		c.LookupEnv = func(k string) (string, bool) {
			if k == "KEY" {
				return secret, true
			}
			return "", false
		}
		l := zerolog.New(logs)
		c.Logger = &l
	})

	st, out := b.runScript(t, "masked", "keyed",
		`echo "token: $KEY"; printf 'split: sk-live-7f3'; sleep 0.3; printf 'a9c21e4 done\n'; echo "401 $KEY" >&2; exit 1`)
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, "token: ***\nsplit: *** done\n", string(out.stdout))
	require.Greater(t, len(out.chunks), 1, "the output came in several chunks")
	require.Equal(t, "401 ***\n", string(out.stderr))
	require.Equal(t, "exit code 1: 401 ***", st.Reason)

	var all strings.Builder
	for _, m := range b.events(t, "masked") {
		all.Write(m.Data())
	}
	fin := finishedEvent(t, b, "masked")
	require.Equal(t, "exit code 1: 401 ***", fin.Reason)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dl, err := b.js.Stream(ctx, messages.StreamFailed)
	require.NoError(t, err)
	raw, err := dl.GetLastMsgForSubject(ctx, messages.SubjectFailed(messages.DefaultPool, "masked"))
	require.NoError(t, err)
	require.Equal(t, "exit code 1: 401 ***", raw.Header.Get(messages.HeaderError))
	for k, v := range raw.Header {
		all.WriteString(k + ": " + strings.Join(v, ",") + "\n")
	}
	require.NotContains(t, all.String(), "7f3a9c21e4", "events and dead letter")
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "401 ***") }, 10*time.Second, 20*time.Millisecond)
	require.NotContains(t, logs.String(), "7f3a9c21e4", "worker log")
}
