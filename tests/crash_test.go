package tests

// Crash points and shutdown, end to end: real `jetcrew worker` processes
// against an embedded nats-server, real Docker. A worker started with
// JETCREW_FAILPOINT=<point> kills itself with SIGKILL when a run reaches
// that point (worker.Failpoint*); a fresh worker must then bring every run
// to exactly one, right, final state, never run two containers of one run
// at once, leave no container behind, and dead-letter each failure once.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// crashAckWait is the consumer's ack wait in these tests: how long a killed
// worker's run waits before it is redelivered. Every worker of one server
// must use the same (each worker start updates the consumer).
const crashAckWait = "3s"

// opsBuffer is a bytes.Buffer safe for a child process's writes and the
// test's reads.
type opsBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *opsBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *opsBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// opsWorker is a `jetcrew worker` child process.
type opsWorker struct {
	id     string
	cmd    *exec.Cmd
	stderr *opsBuffer
	done   chan struct{}
}

// startOpsWorker starts `jetcrew worker --nats url --id id args...` with the
// extra environment env. A worker still running when the test ends is
// stopped with SIGTERM (SIGKILL after 30s). Its state directory (run
// directories, bridge sockets) is under a short temporary directory, removed
// when the test ends: a killed worker cannot clean up after itself.
func startOpsWorker(t *testing.T, url, id string, env []string, args ...string) *opsWorker {
	t.Helper()
	tmp, err := os.MkdirTemp("", "jc")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(tmp) }) // runs after the worker stopped
	cmd := exec.Command(jetcrewBin, append([]string{"worker", "--nats", url, "--id", id}, args...)...)
	cmd.Env = append(append(os.Environ(), "TMPDIR="+tmp), env...)
	w := &opsWorker{id: id, cmd: cmd, stderr: &opsBuffer{}, done: make(chan struct{})}
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
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-w.done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-w.done
			t.Errorf("worker %s did not stop within 30s of SIGTERM\n%s", id, w.stderr.String())
		}
	})
	return w
}

// wait waits for the process to exit, at most d.
func (w *opsWorker) wait(t *testing.T, d time.Duration) *os.ProcessState {
	t.Helper()
	select {
	case <-w.done:
		return w.cmd.ProcessState
	case <-time.After(d):
		t.Fatalf("worker %s still running after %s\n%s", w.id, d, w.stderr.String())
		return nil
	}
}

// stop stops the worker with SIGTERM and requires a clean exit.
func (w *opsWorker) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, w.cmd.Process.Signal(syscall.SIGTERM))
	ps := w.wait(t, 30*time.Second)
	require.Equal(t, 0, ps.ExitCode(), "worker %s\n%s", w.id, w.stderr.String())
}

// containerTracker follows the jetcrew containers of the runs whose id has
// a prefix, from Docker's event stream (exact order) and by polling `docker
// ps` (as an operator would see it), and records the most containers of one
// run that were running at the same time.
type containerTracker struct {
	prefix string
	mu     sync.Mutex
	// running holds, per run id, the containers started and not yet dead,
	// as the event stream says.
	running map[string]map[string]bool
	// most is, per run id and role (roleKey), the most containers running
	// at once, by either view.
	most map[string]int
	// events counts the event stream's container starts per run id.
	starts map[string]int
}

func trackContainers(t *testing.T, prefix string) *containerTracker {
	t.Helper()
	ct := &containerTracker{prefix: prefix, running: map[string]map[string]bool{}, most: map[string]int{}, starts: map[string]int{}}
	since := strconv.FormatInt(time.Now().Add(-time.Second).Unix(), 10)
	ev := exec.Command("docker", "events", "--since", since, "--filter", "type=container",
		"--filter", "label="+jail.LabelManaged+"=true", "--format", "{{json .}}")
	out, err := ev.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, ev.Start())
	evDone := make(chan struct{})
	go func() {
		defer close(evDone)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ct.event(sc.Bytes())
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	pollDone := make(chan struct{})
	go func() {
		defer close(pollDone)
		for ctx.Err() == nil {
			ct.poll(ctx)
			sleepCtx(ctx, 100*time.Millisecond)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-pollDone
		_ = ev.Process.Kill()
		<-evDone
		_ = ev.Wait()
	})
	return ct
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (ct *containerTracker) event(line []byte) {
	var e struct {
		Action string `json:"Action"`
		Actor  struct {
			ID         string            `json:"ID"`
			Attributes map[string]string `json:"Attributes"`
		} `json:"Actor"`
	}
	if json.Unmarshal(line, &e) != nil {
		return
	}
	run := e.Actor.Attributes[jail.LabelRunID]
	if !strings.HasPrefix(run, ct.prefix) {
		return
	}
	key := roleKey(run, e.Actor.Attributes[jail.LabelRole])
	ct.mu.Lock()
	defer ct.mu.Unlock()
	if ct.running[key] == nil {
		ct.running[key] = map[string]bool{}
	}
	switch e.Action {
	case "start":
		ct.starts[run]++
		ct.running[key][e.Actor.ID] = true
		ct.most[key] = max(ct.most[key], len(ct.running[key]))
	case "die", "destroy":
		delete(ct.running[key], e.Actor.ID)
	}
}

// roleKey keys a container of run by its role (jail.LabelRole): a
// workspace run's capture container runs beside the run's own by design
// (it holds the workspace volume), so each role is counted on its own.
func roleKey(run, role string) string {
	return run + "/" + role
}

func (ct *containerTracker) poll(ctx context.Context) {
	out, err := exec.CommandContext(ctx, "docker", "ps", "--filter", "label="+jail.LabelManaged+"=true",
		"--filter", "status=running", "--format", `{{.Label "`+jail.LabelRunID+`"}} {{.Label "`+jail.LabelRole+`"}}`).Output()
	if err != nil {
		return
	}
	n := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		run, role, _ := strings.Cut(line, " ")
		if strings.HasPrefix(run, ct.prefix) {
			n[roleKey(run, role)]++
		}
	}
	ct.mu.Lock()
	defer ct.mu.Unlock()
	for key, c := range n {
		ct.most[key] = max(ct.most[key], c)
	}
}

// mostRunning returns the most containers of run in one role (the run's
// own, or its capture container) that ran at once, and how many of its
// containers were started.
func (ct *containerTracker) mostRunning(run string) (most, starts int) {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return max(ct.most[roleKey(run, jail.RoleRun)], ct.most[roleKey(run, jail.RoleCapture)]), ct.starts[run]
}

// mostOwn returns the most of run's own containers (jail.RoleRun) that ran
// at once.
func (ct *containerTracker) mostOwn(run string) int {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return ct.most[roleKey(run, jail.RoleRun)]
}

// allRunContainers returns the names of every container of run, its
// capture containers included.
func allRunContainers(t *testing.T, run string) []string {
	t.Helper()
	out, err := exec.Command("docker", "ps", "-a", "--filter", "label="+jail.LabelRunID+"="+run, "--format", "{{.Names}}").Output()
	require.NoError(t, err)
	return strings.Fields(string(out))
}

// runContainers returns the states of run's own containers (docker ps -a),
// not its capture container's: a workspace run's holds the workspace
// volume from staging to capture, and a killed worker leaves it as it was.
func runContainers(t *testing.T, run string) []string {
	t.Helper()
	out, err := exec.Command("docker", "ps", "-a", "--filter", "label="+jail.LabelRunID+"="+run,
		"--filter", "label="+jail.LabelRole+"="+jail.RoleRun, "--format", "{{.State}}").Output()
	require.NoError(t, err)
	return strings.Fields(string(out))
}

// crashCase is one crash point and what must come of the run it kills.
type crashCase struct {
	name   string
	point  string
	prompt string
	// kills is the number of workers in a row that die at the point
	// (default 1); maxDeliver the consumer's max deliver (default 5).
	kills, maxDeliver int
	// left is the state of the container the killed worker leaves behind:
	// "running", "exited", or "" for none.
	left     string
	want     messages.State
	exitCode *int // nil: the state has none
	attempts int
	reason   string // in the final state's reason
	// deadLetters is how many dead letters the run must have.
	deadLetters uint64
	// replaced: the fresh worker removes the killed worker's container;
	// adopted: it adopts it instead (issue 38), the attempt going on.
	replaced, adopted bool
	// replay: the run first fails on a worker without failpoint, and the
	// killed worker takes its replay (jetcrew replay); replays is the
	// Replays the final state must count.
	replay  bool
	replays int
	// workspace: the run has a workspace (submit --workspace) and changes
	// it; its final state must carry a whole result of its last attempt.
	workspace bool
}

func intp(i int) *int { return &i }

func TestCrashPoints(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	prefix := "crash-" + opsSuffix(t) + "-"
	ct := trackContainers(t, prefix)
	const (
		quick  = `echo done`
		long   = `sleep 8; echo done`
		failer = `echo failing >&2; exit 3`
	)
	cases := []crashCase{
		{name: "after-fetch", point: stage.FailpointAfterFetch, prompt: quick,
			want: messages.StateSucceeded, exitCode: intp(0), attempts: 2},
		{name: "after-start", point: stage.FailpointAfterStart, prompt: long, left: "running", replaced: true,
			want: messages.StateSucceeded, exitCode: intp(0), attempts: 2},
		// Killed with the run recorded running: the fresh worker adopts
		// the container, running or exited, and the attempt goes on.
		{name: "running", point: stage.FailpointRunning, prompt: long, left: "running", adopted: true,
			want: messages.StateSucceeded, exitCode: intp(0), attempts: 1},
		{name: "after-exit", point: stage.FailpointAfterExit, prompt: quick, left: "exited", adopted: true,
			want: messages.StateSucceeded, exitCode: intp(0), attempts: 1},
		{name: "after-result", point: stage.FailpointAfterResult, prompt: quick, left: "exited", replaced: true,
			want: messages.StateSucceeded, exitCode: intp(0), attempts: 1},
		{name: "after-result-failed", point: stage.FailpointAfterResult, prompt: failer, left: "exited", replaced: true,
			want: messages.StateFailed, exitCode: intp(3), attempts: 1, reason: "exit code 3", deadLetters: 1},
		{name: "after-dead-letter", point: stage.FailpointAfterDeadLetter, prompt: failer, left: "exited", replaced: true,
			want: messages.StateFailed, exitCode: intp(3), attempts: 1, reason: "exit code 3", deadLetters: 1},
		// Workspace runs: killed with the workspace staged, and with the
		// result stored but not the final state. Each attempt captures its
		// own result; the state names the last one's, whole.
		{name: "after-stage", point: stage.FailpointAfterStage, prompt: `echo done > out.txt`, workspace: true,
			want: messages.StateSucceeded, exitCode: intp(0), attempts: 2},
		// After the capture the tree is gone (the run's container and the
		// capture container exited): the fresh worker's adoption finds so
		// and runs it again; the delivery it handed back for the adoption
		// grace counts an attempt.
		{name: "after-capture", point: stage.FailpointAfterCapture, prompt: `echo done > out.txt`, workspace: true,
			left: "exited", want: messages.StateSucceeded, exitCode: intp(0), attempts: 3},
		// Killed with the workspace run recorded running: the fresh
		// worker adopts it with its volume and capture container, and
		// captures the tree once the agent exits, in attempt 1.
		{name: "workspace-running", point: stage.FailpointRunning, prompt: `sleep 8; echo done > out.txt`, workspace: true,
			left: "running", adopted: true, want: messages.StateSucceeded, exitCode: intp(0), attempts: 1},
		// A replay whose worker dies: its redelivery is still the replay.
		{name: "replay-running", point: stage.FailpointRunning, prompt: `sleep 2; echo failing >&2; exit 3`,
			replay: true, left: "running", adopted: true, replays: 1,
			want: messages.StateFailed, exitCode: intp(3), attempts: 1, reason: "exit code 3", deadLetters: 2},
		// Every delivery dies: the MaxDeliver advisory dead-letters it.
		{name: "max-deliver", point: stage.FailpointAfterFetch, prompt: quick, kills: 2, maxDeliver: 2,
			want: messages.StateFailed, attempts: 2, reason: "MaxDeliver", deadLetters: 1},
		// (Killed after the start, before the running state: a container
		// not proved the run's is never adopted.)
		{name: "max-deliver-started", point: stage.FailpointAfterStart, prompt: `sleep 60`, kills: 2, maxDeliver: 2, left: "running",
			want: messages.StateFailed, attempts: 2, reason: "MaxDeliver", deadLetters: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			id := prefix + c.name
			crashRun(t, c, id)
			most, starts := ct.mostRunning(id)
			if c.workspace && c.adopted {
				// The adopter's capture container starts on the volume
				// before it removes the dead worker's.
				most = ct.mostOwn(id)
			}
			require.LessOrEqual(t, most, 1, "two containers of one run ran at once")
			if c.point != stage.FailpointAfterFetch {
				require.Positive(t, starts, "the container tracker saw no container start")
			}
		})
	}
}

// crashRun submits one run to a fresh server, lets c.kills workers die at
// c.point, then lets a fresh worker finish it, and checks the outcome.
func crashRun(t *testing.T, c crashCase, id string) {
	s := workertest.StartServer(t)
	url := s.ClientURL()
	js := natsClient(t, url)
	maxDeliver := c.maxDeliver
	if maxDeliver == 0 {
		maxDeliver = 5
	}
	flags := []string{"--ack-wait", crashAckWait, "--max-deliver", strconv.Itoa(maxDeliver), "--concurrency", "2"}
	kills := max(c.kills, 1)
	// A worker is ready once its pool's consumer exists and it announced
	// itself in the workers bucket (submit --wait exits 1 when no live
	// worker serves the pool).
	provisioned := func(w *opsWorker) {
		workertest.WaitWorkerReady(t, js, messages.DefaultPool, 30*time.Second, "worker never started\n%s", w.stderr.String())
	}

	if c.replay {
		// The run fails first on a worker that does not die.
		pre := startOpsWorker(t, url, c.name+"-pre", nil, flags...)
		provisioned(pre)
		r := run(t, url, jetcrewBin, "submit", "--wait", "--id", id, c.prompt)
		require.Equal(t, *c.exitCode, r.code, r.stderr)
		waitDeadLetters(t, js, id, 1)
		pre.stop(t)
	}
	for i := range kills {
		w := startOpsWorker(t, url, c.name+"-doomed-"+strconv.Itoa(i), []string{"JETCREW_FAILPOINT=" + c.point}, flags...)
		if i == 0 {
			// Submit once the first worker has created the streams.
			provisioned(w)
			args := []string{"submit", "--id", id, c.prompt}
			if c.workspace {
				dir := t.TempDir()
				require.NoError(t, os.WriteFile(dir+"/in.txt", []byte("in\n"), 0o644))
				args = []string{"submit", "--id", id, "--workspace", dir, c.prompt}
			}
			if c.replay {
				args = []string{"replay", id}
			}
			r := run(t, url, jetcrewBin, args...)
			require.Equal(t, 0, r.code, r.stderr)
		}
		ps := w.wait(t, time.Minute)
		ws, ok := ps.Sys().(syscall.WaitStatus)
		require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "worker must die of SIGKILL: %v\n%s", ps, w.stderr.String())
		require.Contains(t, w.stderr.String(), "JETCREW_FAILPOINT="+c.point+" reached")
	}
	// The killed worker left the container as the point says.
	left := runContainers(t, id)
	if c.left == "" {
		require.Empty(t, left)
	} else {
		require.Equal(t, []string{c.left}, left, "containers the killed worker left")
	}

	fresh := startOpsWorker(t, url, c.name+"-fresh", nil, flags...)
	kv, err := js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	runs, err := js.Stream(t.Context(), messages.StreamRuns)
	require.NoError(t, err)
	var st messages.RunState
	ok := assert.Eventually(t, func() bool {
		e, err := kv.Get(t.Context(), id)
		if err != nil {
			return false
		}
		st = messages.RunState{}
		require.NoError(t, json.Unmarshal(e.Value(), &st))
		info, err := runs.Info(t.Context())
		require.NoError(t, err)
		// Final, and its request off the work queue.
		return st.State.Final() && info.State.Msgs == 0
	}, time.Minute, 100*time.Millisecond)
	if !ok {
		t.Fatalf("run %s: last state %+v, containers %v\nfresh worker:\n%s", id, st, runContainers(t, id), fresh.stderr.String())
	}
	final := time.Now()
	// No container left once the run is final: the delivery that finished
	// it removes every container of the run, its own and dead workers'.
	if !assert.Eventually(t, func() bool { return len(allRunContainers(t, id)) == 0 }, 10*time.Second, 100*time.Millisecond) {
		t.Fatalf("run %s is %s but its containers are left: %v\nfresh worker:\n%s", id, st.State, allRunContainers(t, id), fresh.stderr.String())
	}
	t.Logf("%s: %s after %d attempt(s); containers gone %s after the final state", c.name, st.State, st.Attempts, time.Since(final).Round(time.Millisecond))

	require.Equal(t, c.want, st.State, st.Reason)
	require.Equal(t, c.attempts, st.Attempts)
	require.Equal(t, c.exitCode, st.ExitCode)
	require.Contains(t, st.Reason, c.reason)
	require.Equal(t, c.replays, st.Replays, "replays")

	// Exactly one final state per request: one finished event each, one
	// final record for the last request.
	require.Equal(t, uint64(1+c.replays), subjectCount(t, js, messages.StreamEvents, messages.SubjectEvents(id, messages.EventFinished)))
	hist, err := kv.History(t.Context(), id)
	require.NoError(t, err)
	finals := 0
	for _, e := range hist {
		var h messages.RunState
		require.NoError(t, json.Unmarshal(e.Value(), &h))
		if h.State.Final() && h.StreamSeq == st.StreamSeq {
			finals++
		}
	}
	require.Equal(t, 1, finals, "final records of the last request in the state's history")
	require.Equal(t, c.deadLetters, subjectCount(t, js, messages.StreamFailed, messages.SubjectFailed(messages.DefaultPool, id)))
	if c.replaced {
		require.Contains(t, fresh.stderr.String(), "removing an earlier delivery's container")
	}
	if c.adopted {
		require.Contains(t, fresh.stderr.String(), "run adopted")
		require.Equal(t, 1, st.Adoptions)
		require.Equal(t, uint64(1), subjectCount(t, js, messages.StreamEvents, messages.SubjectEvents(id, messages.EventAdopted)))
	}
	if c.workspace {
		checkCrashResult(t, js, st)
	}

	// The outcome stays: nothing is run or recorded again.
	rev := hist[len(hist)-1].Revision()
	time.Sleep(time.Second)
	e, err := kv.Get(t.Context(), id)
	require.NoError(t, err)
	require.Equal(t, rev, e.Revision())
	fresh.stop(t)
}

// A worker stopped with SIGTERM lets its run go on for --drain-timeout,
// then stops it and hands it back; a fresh worker runs it to the end.
func TestDrainHandsBackOnSIGTERM(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	s := workertest.StartServer(t)
	url := s.ClientURL()
	js := natsClient(t, url)
	id := "drain-" + opsSuffix(t)
	ct := trackContainers(t, id)

	first := startOpsWorker(t, url, id+"-first", nil, "--drain-timeout", "1s")
	require.Eventually(t, func() bool {
		_, err := js.Consumer(t.Context(), messages.StreamRuns, messages.ConsumerName(messages.DefaultPool))
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "worker never started\n%s", first.stderr.String())
	r := run(t, url, jetcrewBin, "submit", "--id", id, `sleep 5; echo done`)
	require.Equal(t, 0, r.code, r.stderr)
	waitState(t, url, id, func(st messages.RunState) bool { return st.State == messages.StateRunning })

	stopAt := time.Now()
	first.stop(t)
	require.Less(t, time.Since(stopAt), 15*time.Second, "drain 1s, then stop the container and hand back")
	require.Contains(t, first.stderr.String(), "run handed back on shutdown")
	st := status(t, url, id)
	require.Equal(t, messages.StateQueued, st.State, "handed back, not left running")
	require.Equal(t, "handed back: worker "+id+"-first shut down", st.Reason)
	require.Empty(t, runContainers(t, id), "the stopped run's container is removed")

	second := startOpsWorker(t, url, id+"-second", nil)
	st = waitFinal(t, url, id)
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.Equal(t, 2, st.Attempts)
	require.Equal(t, id+"-second", st.Worker)
	w := run(t, url, jetcrewBin, "watch", id)
	require.Equal(t, 0, w.code, w.stderr)
	require.Equal(t, "done\n", w.stdout, "only the second attempt got to the echo")
	require.Eventually(t, func() bool { return len(runContainers(t, id)) == 0 }, 30*time.Second, 100*time.Millisecond)
	second.stop(t)

	most, starts := ct.mostRunning(id)
	require.Equal(t, 1, most)
	require.Equal(t, 2, starts)
}

// checkCrashResult checks that a workspace run's final state names a whole
// result of its last attempt: every object present with the recorded size.
func checkCrashResult(t *testing.T, js jetstream.JetStream, st messages.RunState) {
	t.Helper()
	wr := st.WorkspaceResult
	require.NotNil(t, wr, "the final state has the workspace result")
	require.Empty(t, wr.Error)
	require.Equal(t, 1, wr.FilesChanged)
	require.NotEmpty(t, wr.Objects)
	obs, err := js.ObjectStore(t.Context(), messages.BucketResults)
	require.NoError(t, err)
	for _, o := range wr.Objects {
		require.True(t, strings.HasPrefix(o.Name, messages.ResultObjectName(st.ID, st.StreamSeq, st.Attempts, "")), o.Name)
		info, err := obs.GetInfo(t.Context(), o.Name)
		require.NoError(t, err, o.Name)
		require.EqualValues(t, o.Size, info.Size, o.Name)
	}
}
