package tests

// The hardening rules, proven through the real worker on a real Docker
// engine: what a run can make the worker spend, and final states that tell
// one story.

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
)

// TestJailChildOOMConsistent: a subshell fills the memory limit and is
// OOM-killed, the main shell prints "survived" and exits 0. The outcome
// follows the main process: succeeded, exit code 0, no
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
// output_dropped_bytes.
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
// output chunks), and fails. The value appears in none
// of: its output events, its state's reason, its dead letter's headers, its
// finished event, the worker's log; "***" stands in its place. Nor is it in
// the container's configuration as the engine shows it (`docker inspect`:
// environment, labels, command line): the launcher sets it at start.
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
	info, ok := b.rt.inspect("masked")
	require.True(t, ok)
	inspected, err := json.Marshal(info)
	require.NoError(t, err)
	require.NotContains(t, string(inspected), "7f3a9c21e4", "docker inspect of the run's container")
	require.NotContains(t, strings.Join(info.Config.Env, "\n"), "KEY=", "the secret's variable is not in Config.Env")

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

// TestJailMountsNameNoHostPath: a worker without a state directory of its
// own makes one under the neutral state root (worker.DefaultStateRoot, as
// root), so what a run sees of its mounts in /proc/self/mountinfo names
// nothing of the host: not the worker's temporary directory, its id or the
// host's name; the run directory and the bridge are bound from the state
// root, under a random name. Stopped, the worker leaves nothing there.
func TestJailMountsNameNoHostPath(t *testing.T) {
	needsDocker(t)
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("the neutral state root needs the worker to run as root, as CI and the deploy guide do")
	}
	b := startJail(t, jailProfile("mounts", "coordination = true"), func(c *worker.Config) { c.StateDir = "" })
	st, out := b.runScript(t, "mountinfo", "mounts", "cat /proc/self/mountinfo")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	info := string(out.stdout)
	leaks := []string{os.TempDir() + "/", b.workerID}
	if host, _ := os.Hostname(); len(host) >= 6 {
		leaks = append(leaks, host)
	}
	for _, leak := range leaks {
		require.NotContains(t, info, leak, "mountinfo names the host")
	}
	roots := map[string]string{} // mount point → its root in the host's file system
	for _, line := range strings.Split(info, "\n") {
		f := strings.Fields(line)
		if len(f) > 4 {
			roots[f[4]] = f[3]
		}
	}
	for _, target := range []string{"/run/jetcrew", "/opt/jetcrew/bridge"} {
		require.Contains(t, roots, target)
		require.True(t, strings.HasPrefix(roots[target], worker.DefaultStateRoot+"/w-"), "%s is bound from %s", target, roots[target])
	}
	rel, _ := strings.CutPrefix(roots["/run/jetcrew"], worker.DefaultStateRoot+"/")
	stateDir := filepath.Join(worker.DefaultStateRoot, strings.SplitN(rel, "/", 2)[0])
	_, err := os.Stat(stateDir)
	require.NoError(t, err, "the worker's state directory, while it runs")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, b.w.Stop(ctx))
	_, err = os.Stat(stateDir)
	require.ErrorIs(t, err, os.ErrNotExist, "a stopped worker leaves nothing of its state directory")
}
