// Package tests holds end-to-end tests of the built jetcrew binary against a
// real Docker Engine, a real (embedded) nats-server and the stock NATS CLI.
// They fail, never skip, when Docker or the NATS CLI is missing, unless
// JETCREW_SKIP_DOCKER=1 is set deliberately.
package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
)

var (
	jetcrewBin string // built by TestMain
	natsBin    string
)

func repoRoot() string {
	dir, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			panic("go.mod not found")
		}
		dir = parent
	}
}

// skipReason, set by TestMain when JETCREW_SKIP_DOCKER=1, is why every
// test of the package skips (needsDocker).
var skipReason string

// TestMain builds the binaries and images the tests use and runs them. It
// fails every test when that cannot be done (Docker or the NATS CLI
// missing), unless JETCREW_SKIP_DOCKER=1 asks to skip them deliberately:
// then it prepares nothing and every test reports itself skipped (go test
// -v shows each SKIP), after a banner on stdout.
func TestMain(m *testing.M) {
	if os.Getenv("JETCREW_SKIP_DOCKER") == "1" {
		skipReason = "JETCREW_SKIP_DOCKER=1: end-to-end test skipped deliberately (it needs Docker and the NATS CLI)"
		fmt.Println("#### JETCREW_SKIP_DOCKER=1: SKIPPING every end-to-end test of github.com/jetcrew/jetcrew/tests deliberately: none of them ran ####")
		os.Exit(m.Run())
	}
	err := prepare()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tests: cannot run the end-to-end tests:", err)
	}
	code := 1
	if err == nil {
		code = m.Run()
	}
	if jetcrewBin != "" {
		_ = os.RemoveAll(filepath.Dir(jetcrewBin))
	}
	os.Exit(code)
}

// needsDocker skips t when JETCREW_SKIP_DOCKER=1 asked TestMain to skip
// the end-to-end tests; every test of the package calls it first.
func needsDocker(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}

func prepare() error {
	root := repoRoot()
	if out, err := exec.Command("docker", "info").CombinedOutput(); err != nil {
		return fmt.Errorf("docker engine unreachable (set JETCREW_SKIP_DOCKER=1 to skip deliberately): %v\n%s", err, out)
	}
	if out, err := exec.Command("bash", filepath.Join(root, "deploy/sandbox/build.sh")).CombinedOutput(); err != nil {
		return fmt.Errorf("build sandbox image: %v\n%s", err, out)
	}
	dir, err := os.MkdirTemp("", "jetcrew-e2e-bin")
	if err != nil {
		return err
	}
	// The worker stages its own executable as the bridge; jetcrew-bridge,
	// the separate bridge binary, is what the jail tests' workers stage.
	jetcrewBin = filepath.Join(dir, "jetcrew")
	for bin, pkg := range map[string]string{jetcrewBin: "./cmd/jetcrew", filepath.Join(dir, "jetcrew-bridge"): "./cmd/jetcrew-bridge"} {
		build := exec.Command("go", "build", "-trimpath", "-o", bin, pkg)
		build.Dir = root
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %v\n%s", pkg, err, out)
		}
	}
	// Every command the tests run keys its groups with one secret of
	// theirs, never the user's (JETCREW_GROUP_SECRET, docs/security.md).
	if _, err := dispatcher.CreateGroupSecret(filepath.Join(dir, "group.secret")); err != nil {
		return err
	}
	if err := os.Setenv("JETCREW_GROUP_SECRET", filepath.Join(dir, "group.secret")); err != nil {
		return err
	}
	// The worker stages a 0555 copy whatever the mode; keep the source
	// read and execute only too.
	if err := os.Chmod(filepath.Join(dir, "jetcrew-bridge"), 0o555); err != nil {
		return err
	}
	natsBin, err = exec.LookPath("nats")
	if err != nil {
		home, _ := os.UserHomeDir()
		natsBin = filepath.Join(home, "go", "bin", "nats")
		if _, err := os.Stat(natsBin); err != nil {
			return errors.New("the NATS CLI is not installed (make test installs it: go install github.com/nats-io/natscli/nats@v0.5.0)")
		}
	}
	return nil
}

// up starts `jetcrew up` on a random port and returns its NATS URL. The
// process is stopped with SIGTERM when the test ends, and must exit cleanly.
func up(t *testing.T, args ...string) string {
	t.Helper()
	url, _ := upLogged(t, args...)
	return url
}

// upLogged is up that also returns the process's stderr, the worker's log,
// as it is written.
func upLogged(t *testing.T, args ...string) (string, *lockedBuffer) {
	t.Helper()
	url, stderr, _ := upProcess(t, args...)
	return url, stderr
}

// upProcess is upLogged that also returns the process's pid.
func upProcess(t *testing.T, args ...string) (string, *lockedBuffer, int) {
	t.Helper()
	data := t.TempDir()
	cmd := exec.Command(jetcrewBin, append([]string{"up", "--listen", "127.0.0.1:0", "--data", data}, args...)...)
	auth, env := upAuthEnv(t, args)
	auth.data = data
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	urlc := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`nats://[0-9.]+:[0-9]+`)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if u := re.FindString(sc.Text()); u != "" {
				urlc <- u
				break
			}
		}
		for sc.Scan() {
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("jetcrew up did not stop cleanly: %v\n%s", err, stderr.String())
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("jetcrew up did not stop within 30s of SIGINT\n%s", stderr.String())
			// Killed, its worker left its containers: remove them, so a
			// failed test leaves nothing on the engine.
			removeWorkerContainers(t, stderr.String())
		}
	})
	select {
	case u := <-urlc:
		if env != nil {
			authSetups.Store(u, auth)
			t.Cleanup(func() { authSetups.Delete(u) })
		}
		return u, stderr, cmd.Process.Pid
	case <-time.After(60 * time.Second):
		t.Fatalf("jetcrew up printed no NATS URL\n%s", stderr.String())
		return "", nil, 0
	}
}

type result struct {
	stdout, stderr string
	code           int
}

func run(t *testing.T, natsURL string, bin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(append(os.Environ(), "NATS_URL="+natsURL), authEnv(natsURL, roleFor(bin, args))...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return result{o.String(), e.String(), code}
}

func status(t *testing.T, url, id string) messages.RunState {
	t.Helper()
	r := run(t, url, jetcrewBin, "status", "--json", id)
	require.Equal(t, 0, r.code, r.stderr)
	var st messages.RunState
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	return st
}

func waitFinal(t *testing.T, url, id string) messages.RunState {
	t.Helper()
	var st messages.RunState
	require.Eventually(t, func() bool {
		r := run(t, url, jetcrewBin, "status", "--json", id)
		if r.code != 0 {
			return false
		}
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
		return st.State.Final()
	}, time.Minute, 100*time.Millisecond, "run %s never finished", id)
	return st
}

// The main path, end to end on real parts: submit → JetStream → worker →
// jailed container → result.
func TestSubmitWaitShell(t *testing.T) {
	needsDocker(t)
	for _, mode := range authModes {
		t.Run(mode.name, func(t *testing.T) { testSubmitWaitShell(t, mode.args) })
	}
}

func testSubmitWaitShell(t *testing.T, upArgs []string) {
	url := up(t, upArgs...)

	r := run(t, url, jetcrewBin, "submit", "--profile", "shell", "--id", "e2e-ok", "--wait",
		`uname -a; echo hello from $(id -u); grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; touch /x 2>&1 || echo rootfs read-only`)
	require.Equal(t, 0, r.code, "stdout=%s stderr=%s", r.stdout, r.stderr)
	require.Contains(t, r.stderr, "e2e-ok", "the run id is reported on stderr; stdout is the run's own")
	require.Contains(t, r.stdout, "Linux")
	require.Regexp(t, `hello from [1-9][0-9]*`, r.stdout)
	require.Contains(t, r.stdout, "CapEff:\t0000000000000000")
	require.Contains(t, r.stdout, "NoNewPrivs:\t1")
	require.Contains(t, r.stdout, "Read-only file system")

	st := status(t, url, "e2e-ok")
	require.Equal(t, messages.StateSucceeded, st.State)
	require.Equal(t, 0, *st.ExitCode)
	require.Equal(t, 1, st.Attempts)
	require.Equal(t, "shell", st.Profile)
	require.NotEmpty(t, st.Worker)
	require.NotEmpty(t, st.ContainerID)

	// The container was removed after its result was recorded.
	require.Eventually(t, func() bool {
		out, err := exec.Command("docker", "ps", "-aq", "--filter", "label=io.jetcrew.run-id=e2e-ok").Output()
		return err == nil && strings.TrimSpace(string(out)) == ""
	}, 30*time.Second, 100*time.Millisecond)

	// Human status output names the state.
	h := run(t, url, jetcrewBin, "status", "e2e-ok")
	require.Equal(t, 0, h.code)
	require.Contains(t, h.stdout, "succeeded")

	if _, auth := authSetups.Load(url); auth {
		requireSeedsPrivate(t, url)
		// Without credentials the server refuses the connection.
		cmd := exec.Command(jetcrewBin, "status", "e2e-ok")
		cmd.Env = append(os.Environ(), "NATS_URL="+url, "XDG_CONFIG_HOME="+t.TempDir())
		out, err := cmd.CombinedOutput()
		require.Error(t, err)
		require.Contains(t, string(out), "Authorization Violation")
	}
}

func TestSubmitWaitFailureKeepsExitCodeAndOutput(t *testing.T) {
	needsDocker(t)
	url := up(t)
	r := run(t, url, jetcrewBin, "submit", "--profile", "shell", "--id", "e2e-fail", "--wait", `echo to-stdout; echo to-stderr >&2; exit 3`)
	require.NotEqual(t, 0, r.code)
	require.Contains(t, r.stdout, "to-stdout")
	require.Contains(t, r.stderr, "to-stderr")
	st := status(t, url, "e2e-fail")
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, 3, *st.ExitCode)
	require.Equal(t, 1, st.Attempts)
	require.Contains(t, st.Reason, "exit code 3")

	// Unknown profile: failed with that reason, request not lost.
	r = run(t, url, jetcrewBin, "submit", "--profile", "nope", "--id", "e2e-noprof", "--wait", `true`)
	require.NotEqual(t, 0, r.code)
	st = status(t, url, "e2e-noprof")
	require.Equal(t, messages.StateFailed, st.State)
	require.Contains(t, st.Reason, `unknown profile "nope"`)

	// Both requests are in the dead-letter stream, as submitted.
	nr := run(t, url, natsBin, "stream", "get", messages.StreamFailed, "-S", messages.SubjectFailed("default", "e2e-fail"))
	require.Equal(t, 0, nr.code, nr.stderr)
	require.Contains(t, nr.stdout, `"id":"e2e-fail"`)
}

// A request published by the stock NATS CLI runs the same way; one without
// an id gets one.
func TestRawNATSPublish(t *testing.T) {
	needsDocker(t)
	url := up(t)
	r := run(t, url, natsBin, "pub", "--jetstream", "jetcrew.runs.default", `{"id":"e2e-raw","profile":"shell","prompt":"echo hi from raw"}`)
	require.Equal(t, 0, r.code, r.stderr)
	st := waitFinal(t, url, "e2e-raw")
	require.Equal(t, messages.StateSucceeded, st.State)

	w := run(t, url, jetcrewBin, "watch", "e2e-raw")
	require.Equal(t, 0, w.code, w.stderr)
	require.Contains(t, w.stdout, "hi from raw")

	r = run(t, url, natsBin, "pub", "--jetstream", "jetcrew.runs.default", `{"profile":"shell","prompt":"echo no id"}`)
	require.Equal(t, 0, r.code, r.stderr)
	// Its state appears under a derived id (a ULID).
	require.Eventually(t, func() bool {
		ls := run(t, url, natsBin, "kv", "ls", messages.BucketRuns)
		for _, k := range strings.Fields(ls.stdout) {
			if regexp.MustCompile(`^[0-9A-HJKMNP-TV-Z]{26}$`).MatchString(k) {
				return waitFinal(t, url, k).State == messages.StateSucceeded
			}
		}
		return false
	}, time.Minute, 200*time.Millisecond)

	// An invalid raw request is recorded as failed, not dropped.
	r = run(t, url, natsBin, "pub", "--jetstream", "jetcrew.runs.default", `{"id":"e2e-inv","profile":"shell","image":"evil"}`)
	require.Equal(t, 0, r.code, r.stderr)
	st = waitFinal(t, url, "e2e-inv")
	require.Equal(t, messages.StateFailed, st.State)
	require.Contains(t, st.Reason, `unknown field "image"`)
}

// The dispatcher refuses an invalid request before publishing it.
func TestSubmitRefusesInvalid(t *testing.T) {
	needsDocker(t)
	url := up(t)
	r := run(t, url, jetcrewBin, "submit", "--profile", "shell", "--id", "bad.id", "true")
	require.NotEqual(t, 0, r.code)
	require.Contains(t, r.stderr, "id")
	s := run(t, url, natsBin, "stream", "info", messages.StreamRuns, "--json")
	require.Equal(t, 0, s.code, s.stderr)
	var info struct {
		State struct {
			Msgs uint64 `json:"messages"`
		} `json:"state"`
	}
	require.NoError(t, json.Unmarshal([]byte(s.stdout), &info))
	require.Zero(t, info.State.Msgs)
}

// workerIDInLog matches the worker id in a worker's JSON log lines.
var workerIDInLog = regexp.MustCompile(`"worker":"([^"]+)"`)

// removeWorkerContainers removes every container of the worker whose log
// is log (its id read from the first line naming one), by its label
// (jail.LabelWorker), as the worker's own stop would have.
func removeWorkerContainers(t *testing.T, log string) {
	t.Helper()
	m := workerIDInLog.FindStringSubmatch(log)
	if m == nil {
		return
	}
	out, err := exec.Command("docker", "ps", "-aq", "--filter", "label="+jail.LabelWorker+"="+m[1]).Output()
	if err != nil {
		t.Errorf("list the containers of worker %s: %v", m[1], err)
		return
	}
	if ids := strings.Fields(string(out)); len(ids) > 0 {
		if err := exec.Command("docker", append([]string{"rm", "-f"}, ids...)...).Run(); err != nil {
			t.Errorf("remove the containers of worker %s: %v", m[1], err)
		}
	}
}
