package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// nsWorker is a `jetcrew worker` that is PID 1 of a PID namespace of its
// own (unshare -p -f --mount-proc), as each worker of deploy/compose is in
// its container: pid is its pid in the test's namespace.
type nsWorker struct {
	*opsWorker
	pid int
}

// startNSWorker starts `jetcrew worker --nats url --id id args...` in a PID
// namespace of its own. A worker still running when the test ends is
// stopped with SIGTERM (SIGKILL after 30s).
func startNSWorker(t *testing.T, url, id string, args ...string) *nsWorker {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("a PID namespace of its own (unshare -p) needs root, as CI runs")
	}
	cmd := exec.Command("unshare", append([]string{"-p", "-f", "--mount-proc", "--kill-child", jetcrewBin, "worker", "--nats", url, "--id", id}, args...)...)
	w := &nsWorker{opsWorker: &opsWorker{id: id, cmd: cmd, stderr: &opsBuffer{}, done: make(chan struct{})}}
	cmd.Stderr = w.stderr
	require.NoError(t, cmd.Start())
	go func() {
		_ = cmd.Wait()
		close(w.done)
	}()
	t.Cleanup(func() {
		select {
		case <-w.done:
			return
		default:
		}
		if w.pid > 0 {
			_ = syscall.Kill(w.pid, syscall.SIGTERM)
		}
		select {
		case <-w.done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill() // --kill-child: the worker too
			<-w.done
			t.Errorf("worker %s did not stop within 30s of SIGTERM\n%s", id, w.stderr.String())
		}
	})
	// unshare forks the worker and waits for it; it ignores SIGTERM itself,
	// so the worker is signalled directly.
	children := filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "task", strconv.Itoa(cmd.Process.Pid), "children")
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(children)
		w.pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return w.pid > 0
	}, 10*time.Second, 10*time.Millisecond, "unshare started no worker")
	return w
}

// stateDirRE finds the state directory a worker made in its log.
var stateDirRE = regexp.MustCompile(`"state_dir":"([^"]+)","time":"[^"]+","message":"state directory made`)

// started waits until the worker logged that it started and returns the
// state directory it made.
func (w *nsWorker) started(t *testing.T) string {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(w.stderr.String(), `"message":"worker started"`) },
		time.Minute, 20*time.Millisecond, "worker %s never started\n%s", w.id, w.stderr.String())
	m := stateDirRE.FindStringSubmatch(w.stderr.String())
	require.NotNil(t, m, "worker %s made no state directory\n%s", w.id, w.stderr.String())
	return m[1]
}

// stop stops the worker with SIGTERM and requires a clean exit.
func (w *nsWorker) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, syscall.Kill(w.pid, syscall.SIGTERM))
	ps := w.wait(t, 30*time.Second)
	require.Equal(t, 0, ps.ExitCode(), "worker %s\n%s", w.id, w.stderr.String())
}

// TestStateDirAcrossPIDNamespaces is issue 36's "a starting worker deletes
// another live worker's state directory": workers sharing one state root
// from PID namespaces of their own, each PID 1 there (deploy/compose's
// worker-1 and worker-2). A run is in flight on the first while a second
// worker starts, and a third worker, killed (SIGKILL), left its directory
// behind: the second removes the dead worker's directory and keeps the
// live one's, and the run in flight, which reads its run directory after
// the second start, succeeds.
func TestStateDirAcrossPIDNamespaces(t *testing.T) {
	needsDocker(t)
	t.Parallel()
	s := workertest.StartServer(t)
	url := s.ClientURL()
	// Short: a bridge socket's path is at most 107 bytes.
	root, err := os.MkdirTemp("", "jcs")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	suffix := opsSuffix(t)
	id := "ns-run-" + suffix
	// Last, after the workers: a worker that lost its directory may leave
	// the run's container.
	t.Cleanup(func() {
		for _, c := range allRunContainers(t, id) {
			_ = exec.Command("docker", "rm", "-f", c).Run()
		}
	})

	first := startNSWorker(t, url, "ns-first-"+suffix, "--state-root", root)
	firstDir := first.started(t)
	r := run(t, url, jetcrewBin, "submit", "--id", id, "while [ ! -e /tmp/go ]; do sleep 0.1; done; cat /run/jetcrew/mcp.json")
	require.Equal(t, 0, r.code, r.stderr)
	st := waitRunning(t, url, id)

	// A worker of another pool (it takes no run) is killed: its directory
	// and marker stay, its lock goes with it.
	dead := startNSWorker(t, url, "ns-dead-"+suffix, "--state-root", root, "--pool", "ns-dead")
	deadDir := dead.started(t)
	require.NoError(t, syscall.Kill(dead.pid, syscall.SIGKILL))
	dead.wait(t, 30*time.Second)
	require.DirExists(t, deadDir, "a killed worker cannot remove its directory")

	second := startNSWorker(t, url, "ns-second-"+suffix, "--state-root", root)
	secondDir := second.started(t)
	require.NoDirExists(t, deadDir, "the dead worker's directory is reclaimed\n%s", second.stderr.String())
	require.Contains(t, second.stderr.String(), "removing the state directory a dead worker left")
	require.DirExists(t, firstDir, "the live worker's directory stays\n%s", second.stderr.String())
	require.FileExists(t, filepath.Join(firstDir, ".jetcrew-worker"), "with its marker")

	// The run in flight reads its run directory now.
	out, err := exec.Command("docker", "ps", "-q", "--filter", "label="+jail.LabelRunID+"="+id,
		"--filter", "label="+jail.LabelRole+"="+jail.RoleRun).Output()
	require.NoError(t, err)
	require.Len(t, strings.Fields(string(out)), 1, "the run's container")
	require.True(t, strings.HasPrefix(st.ContainerID, strings.TrimSpace(string(out))), "%s, %s", st.ContainerID, out)
	exe, err := exec.Command("docker", "exec", strings.TrimSpace(string(out)), "touch", "/tmp/go").CombinedOutput()
	require.NoError(t, err, "%s", exe)
	st = waitFinal(t, url, id)
	require.Equal(t, messages.StateSucceeded, st.State, "%s\n%s", st.Reason, first.stderr.String())
	w := run(t, url, jetcrewBin, "watch", id)
	require.Contains(t, w.stdout, "mcpServers", "the run read its mcp.json")
	t.Logf("first %s kept, dead %s reclaimed by second %s; run %s %s", firstDir, deadDir, secondDir, id, st.State)

	first.stop(t)
	second.stop(t)
	for _, d := range []string{firstDir, secondDir} {
		require.NoDirExists(t, d, "a stopped worker removes its directory")
	}
	left, err := os.ReadDir(root)
	require.NoError(t, err)
	require.Empty(t, left, "nothing left in the state root")
}
