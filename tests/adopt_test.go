package tests

// A run outlives its worker (issue 38): real `jetcrew worker` processes
// killed (SIGKILL) or stopped for an upgrade (SIGUSR2) with runs in
// flight, real Docker; the next worker adopts the runs.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// adoptLines is how many lines an adopted run's agent writes to each
// stream, one every adoptEvery.
const (
	adoptLines = 40
	adoptEvery = "0.5"
)

// numberedLines returns an agent that says who it is (its process id and
// its start time, in clock ticks since boot: a process started again says
// another), then writes n numbered lines to each stream, one every
// adoptEvery.
func numberedLines(n int) string {
	return fmt.Sprintf(`echo "agent $$ $(cut -d' ' -f22 /proc/$$/stat)"; i=0; while [ $i -lt %d ]; do i=$((i+1)); echo "line $i"; echo "err $i" >&2; sleep %s; done`,
		n, adoptEvery)
}

// TestAdoptAfterWorkerStops: four runs in flight; their worker is killed
// (SIGKILL) or stopped for an upgrade (SIGUSR2), and a new worker process
// started. Every run ends succeeded in its first attempt, adopted once by
// the new worker; its agent was never started again (one "agent" line,
// the same process throughout); every line it wrote is published once, in
// order, those written while no worker watched included; its receipt is
// the one it started with; no container is left.
func TestAdoptAfterWorkerStops(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
	}{{"kill", syscall.SIGKILL}, {"upgrade", syscall.SIGUSR2}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			adoptAfter(t, tc.name, tc.sig)
		})
	}
}

func adoptAfter(t *testing.T, name string, sig syscall.Signal) {
	s := workertest.StartServer(t)
	url := s.ClientURL()
	js := natsClient(t, url)
	prefix := "adopt-" + name + "-" + opsSuffix(t)
	flags := []string{"--ack-wait", "3s", "--concurrency", "8"}
	first := startOpsWorker(t, url, prefix+"-first", nil, flags...)
	workertest.WaitWorkerReady(t, js, messages.DefaultPool, 30*time.Second, "worker never started\n%s", first.stderr.String())
	ids, before := submitRunning(t, url, prefix, 4, numberedLines(adoptLines))
	time.Sleep(2 * time.Second) // some lines published by the first worker
	stopLeavingRuns(t, first, sig, ids)
	time.Sleep(time.Second) // lines written while no worker watches
	startedAt := time.Now()
	second := startOpsWorker(t, url, prefix+"-second", nil, flags...)
	for _, id := range ids {
		st := waitFinal(t, url, id)
		require.Equal(t, messages.StateSucceeded, st.State, "%s: %s\n%s", id, st.Reason, second.stderr.String())
		require.Equal(t, 1, st.Attempts)
		require.Equal(t, 1, st.Adoptions)
		require.Equal(t, prefix+"-second", st.Worker)
		require.Equal(t, before[id].Receipt, st.Receipt, "the receipt is the one the run started with")
		require.Equal(t, before[id].StartedAt, st.StartedAt)
		requireWholeOutput(t, url, js, id, adoptLines)
	}
	t.Logf("%s: the new worker adopted and finished 4 runs %s after its start", name, time.Since(startedAt).Round(time.Millisecond))
	requireNoContainers(t, ids)
	second.stop(t)
}

// submitRunning submits n runs of script whose ids start with prefix and
// waits until each is running; it returns their ids and the records that
// said so.
func submitRunning(t *testing.T, url, prefix string, n int, script string) ([]string, map[string]messages.RunState) {
	t.Helper()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		ids = append(ids, id)
		r := run(t, url, jetcrewBin, "submit", "--id", id, script)
		require.Equal(t, 0, r.code, r.stderr)
	}
	before := map[string]messages.RunState{}
	for _, id := range ids {
		before[id] = waitState(t, url, id, func(st messages.RunState) bool { return st.State == messages.StateRunning })
	}
	return ids, before
}

// stopLeavingRuns kills w (SIGKILL) or stops it for an upgrade (SIGUSR2:
// it exits 0, saying it left its runs), and requires that the container
// of each of ids runs on.
func stopLeavingRuns(t *testing.T, w *opsWorker, sig syscall.Signal, ids []string) {
	t.Helper()
	require.NoError(t, w.cmd.Process.Signal(sig))
	ps := w.wait(t, 30*time.Second)
	if sig == syscall.SIGUSR2 {
		require.Equal(t, 0, ps.ExitCode(), w.stderr.String())
		require.Contains(t, w.stderr.String(), "run left running for a successor to adopt")
	}
	for _, id := range ids {
		require.Equal(t, []string{"running"}, runContainers(t, id), "the run's container runs on")
	}
}

// requireNoContainers requires that no container of the runs ids is left
// (within 30 s: the last run's is being removed).
func requireNoContainers(t *testing.T, ids []string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, id := range ids {
			if len(allRunContainers(t, id)) > 0 {
				return false
			}
		}
		return true
	}, 30*time.Second, 100*time.Millisecond, "no container is left")
}

// TestAdoptWorkspaceAfterUpgrade: a workspace run's worker is stopped for
// an upgrade (SIGUSR2) while the agent works in the tree; the run's
// container and its capture container run on, holding the volume, and a
// new worker process adopts the run: the result, captured once the agent
// exits, holds what the agent wrote before and after the stop, in the
// first attempt, and no container or volume is left.
func TestAdoptWorkspaceAfterUpgrade(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	s := workertest.StartServer(t)
	url := s.ClientURL()
	js := natsClient(t, url)
	id := "adopt-ws-" + opsSuffix(t)
	flags := []string{"--ack-wait", "3s"}
	first := startOpsWorker(t, url, id+"-first", nil, flags...)
	workertest.WaitWorkerReady(t, js, messages.DefaultPool, 30*time.Second, "worker never started\n%s", first.stderr.String())
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "in.txt"), []byte("in\n"), 0o644))
	r := run(t, url, jetcrewBin, "submit", "--id", id, "--workspace", dir,
		`echo before > before.txt; echo wrote; sleep 6; echo after > after.txt`)
	require.Equal(t, 0, r.code, r.stderr)
	waitState(t, url, id, func(st messages.RunState) bool { return st.State == messages.StateRunning })
	time.Sleep(2 * time.Second)

	require.NoError(t, first.cmd.Process.Signal(syscall.SIGUSR2))
	ps := first.wait(t, 30*time.Second)
	require.Equal(t, 0, ps.ExitCode(), first.stderr.String())
	require.Contains(t, first.stderr.String(), "run left running for a successor to adopt")
	require.Equal(t, []string{"running"}, runContainers(t, id), "the run's container runs on")
	require.Len(t, allRunContainers(t, id), 2, "and so does its capture container")

	second := startOpsWorker(t, url, id+"-second", nil, flags...)
	st := waitFinal(t, url, id)
	require.Equal(t, messages.StateSucceeded, st.State, "%s\n%s", st.Reason, second.stderr.String())
	require.Equal(t, 1, st.Attempts)
	require.Equal(t, 1, st.Adoptions)
	wr := st.WorkspaceResult
	require.NotNil(t, wr)
	require.Empty(t, wr.Error)
	require.Equal(t, 2, wr.FilesChanged, "what the agent wrote before and after the stop")
	obs, err := js.ObjectStore(t.Context(), messages.BucketResults)
	require.NoError(t, err)
	patch, err := obs.GetBytes(t.Context(), messages.ResultObjectName(id, st.StreamSeq, 1, messages.ResultPatch))
	require.NoError(t, err)
	require.Contains(t, string(patch), "+before\n")
	require.Contains(t, string(patch), "+after\n")
	require.Eventually(t, func() bool {
		vols, err := exec.Command("docker", "volume", "ls", "-q", "--filter", "label="+jail.LabelRunID+"="+id).Output()
		require.NoError(t, err)
		return len(allRunContainers(t, id)) == 0 && strings.TrimSpace(string(vols)) == ""
	}, 30*time.Second, 100*time.Millisecond, "no container or volume is left")
	second.stop(t)
}

// requireWholeOutput requires that run id's stdout (jetcrew watch) is
// what numberedLines(lines) writes: its agent line, then every numbered
// line once and in order; and that the run has one adopted event.
func requireWholeOutput(t *testing.T, url string, js jetstream.JetStream, id string, lines int) {
	t.Helper()
	w := run(t, url, jetcrewBin, "watch", id)
	require.Equal(t, 0, w.code, w.stderr)
	out := strings.Split(strings.TrimSuffix(w.stdout, "\n"), "\n")
	require.Len(t, out, lines+1, "%s's stdout:\n%s", id, w.stdout)
	require.True(t, strings.HasPrefix(out[0], "agent "), out[0])
	for i, l := range out[1:] {
		require.Equal(t, fmt.Sprintf("line %d", i+1), l, "%s: every line once, in order", id)
	}
	require.Equal(t, uint64(1), subjectCount(t, js, messages.StreamEvents, messages.SubjectEvents(id, messages.EventAdopted)))
}
