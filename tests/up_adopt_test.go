package tests

// A run outlives `jetcrew up` (issue 38): the process that is both the
// NATS server and the worker is killed (SIGKILL) or stopped for an upgrade
// (SIGUSR2) with runs in flight, and started again on the same data
// directory: its server comes back with the streams on disk, and its new
// worker adopts the runs.

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// upAdoptLines is how many lines each run's agent writes to each stream
// (numberedLines), one every adoptEvery: about 30 s, long enough to be
// running when the worker of a restarted `jetcrew up` adopts it after a
// SIGKILL, once the killed worker's heartbeat has expired
// (messages.WorkerTTL) and the reconciler's pass after it ran.
const upAdoptLines = 60

// TestUpRestartAdopts: `jetcrew up` with three runs in flight is killed
// (SIGKILL) or stopped for an upgrade (SIGUSR2), then started again with
// the same --data, --listen and state root (a new worker id, as a restart
// gets). Every run ends succeeded in its first attempt, adopted once by
// the new process's worker, its agent never started again, every line it
// wrote published once and in order; no container is left.
func TestUpRestartAdopts(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
	}{{"kill", syscall.SIGKILL}, {"upgrade", syscall.SIGUSR2}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			upRestartAdopts(t, tc.name, tc.sig)
		})
	}
}

func upRestartAdopts(t *testing.T, name string, sig syscall.Signal) {
	data := t.TempDir()
	// A short state root, shared by both processes as the workers of one
	// host share /var/lib/jetcrew/state (the sockets' paths stay short).
	root, err := os.MkdirTemp("", "jc")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	first, url := startUpAt(t, "127.0.0.1:0", data, root)
	prefix := "up-adopt-" + name + "-" + opsSuffix(t)
	ids, before := submitRunning(t, url, prefix, 3, numberedLines(upAdoptLines))
	time.Sleep(2 * time.Second) // some lines published by the first worker
	stopLeavingRuns(t, first, sig, ids)
	_, port, err := net.SplitHostPort(url[len("nats://"):])
	require.NoError(t, err)
	startedAt := time.Now()
	second, url2 := startUpAt(t, "127.0.0.1:"+port, data, root)
	require.Equal(t, url, url2)
	js := natsClient(t, url)
	for _, id := range ids {
		st := waitFinal(t, url, id)
		require.Equal(t, messages.StateSucceeded, st.State, "%s: %s\n%s", id, st.Reason, second.stderr.String())
		require.Equal(t, 1, st.Attempts, id)
		require.Equal(t, 1, st.Adoptions, "%s\n%s", id, second.stderr.String())
		require.NotEqual(t, before[id].Worker, st.Worker, "the restarted process's worker finished it")
		require.Equal(t, before[id].Receipt, st.Receipt, "the receipt is the one the run started with")
		requireWholeOutput(t, url, js, id, upAdoptLines)
		ev := adoptedEvent(t, js, id)
		t.Logf("%s: adopted %s after the first process's last record of it", id, time.Duration(ev.GapMS)*time.Millisecond)
	}
	t.Logf("%s: the restarted jetcrew up adopted and finished 3 runs %s after its start", name, time.Since(startedAt).Round(time.Millisecond))
	requireNoContainers(t, ids)
	require.NoError(t, second.cmd.Process.Signal(os.Interrupt))
	ps := second.wait(t, 30*time.Second)
	require.Equal(t, 0, ps.ExitCode(), second.stderr.String())
}

var natsURLLine = regexp.MustCompile(`^NATS_URL=(nats://[0-9.]+:[0-9]+)$`)

// startUpAt starts `jetcrew up --listen listen --data data --state-root
// root --ui off` and returns it, once it printed its NATS URL, and the
// URL. A process still running when the test ends is stopped with SIGTERM
// (SIGKILL after 30 s, and then its worker's containers are removed).
func startUpAt(t *testing.T, listen, data, root string) (*opsWorker, string) {
	t.Helper()
	cmd := exec.Command(jetcrewBin, "up", "--listen", listen, "--data", data, "--state-root", root, "--ui", "off", "--concurrency", "8")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	p := &opsWorker{id: "up " + listen, cmd: cmd, stderr: &opsBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	require.NoError(t, cmd.Start())
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := natsURLLine.FindStringSubmatch(sc.Text()); m != nil {
				urlc <- m[1]
			}
		}
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
			return
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
			t.Errorf("jetcrew up did not stop within 30s of SIGTERM\n%s", p.stderr.String())
			removeWorkerContainers(t, p.stderr.String())
		}
	})
	select {
	case u := <-urlc:
		return p, u
	case <-p.done:
		t.Fatalf("jetcrew up exited before it printed its NATS URL\n%s", p.stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("jetcrew up printed no NATS URL\n%s", p.stderr.String())
	}
	return nil, ""
}

// adoptedEvent returns run id's adopted event.
func adoptedEvent(t *testing.T, js jetstream.JetStream, id string) messages.Event {
	t.Helper()
	s, err := js.Stream(t.Context(), messages.StreamEvents)
	require.NoError(t, err)
	m, err := s.GetLastMsgForSubject(t.Context(), messages.SubjectEvents(id, messages.EventAdopted))
	require.NoError(t, err)
	var ev messages.Event
	require.NoError(t, json.Unmarshal(m.Data, &ev))
	return ev
}
