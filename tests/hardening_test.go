package tests

// Issue 13 ("Hardening"), proven through the real worker on a real Docker
// engine: what a run can make the worker spend, and final states that tell
// one story.

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// TestJailChildOOMConsistent: a subshell fills the memory limit and is
// OOM-killed, the main shell prints "survived" and exits 0 (issue 13 item
// 21). The outcome follows the main process: succeeded, exit code 0, no
// reason, and the state and finished event carry oom_killed. A main process
// killed at the limit stays failed, reason "oom", exit 137
// (TestJailMemoryOOM).
func TestJailChildOOMConsistent(t *testing.T) {
	t.Parallel()
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
	b := startJail(t, jailProfile("small", "max_output_mib = 1"), nil)

	st, out := b.runScript(t, "budget", "small", `head -c 5000000 /dev/zero; echo done >&2`)
	require.Equal(t, messages.StateSucceeded, st.State, "reason %q", st.Reason)
	require.EqualValues(t, 1<<20, st.OutputBytes)
	require.EqualValues(t, 5000000+5-(1<<20), st.OutputDroppedBytes)
	require.Len(t, out.stdout, 1<<20)
	require.Empty(t, out.stderr, "past the budget, stderr is dropped too")
}
