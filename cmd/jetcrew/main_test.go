package main

import (
	"github.com/jetcrew/jetcrew/internal/leaktest"
	"go.uber.org/goleak"

	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// syncBuffer is a bytes.Buffer safe for the concurrent writes of loggers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testApp is an app whose streams are buffers, whose environment is env and
// whose container runtime is rt (a fake).
type testApp struct {
	*app
	stdout, stderr *syncBuffer
}

func newTestApp(env map[string]string, rt jail.Runtime) *testApp {
	out, errb := &syncBuffer{}, &syncBuffer{}
	a := newApp()
	a.bridgePath = testBridge
	a.stdin = strings.NewReader("")
	a.stdout, a.stderr = out, errb
	a.getenv = func(k string) string { return env[k] }
	// Tests never read the real user's NATS configuration: only an
	// XDG_CONFIG_HOME in env gives them one.
	a.natsConfigRoot = func() (string, error) { return "", errors.New("no configuration directory in tests") }
	// The default group secret: under the test's XDG_CONFIG_HOME, else one
	// directory every test shares.
	a.groupSecretRoot = func() (string, error) {
		if x := env["XDG_CONFIG_HOME"]; x != "" {
			return x, nil
		}
		return testConfigDir, nil
	}
	a.newRuntime = func(context.Context, zerolog.Logger) (jail.Runtime, func() error, error) {
		if rt == nil {
			fake := workertest.NewRuntime()
			return fake, func() error { fake.Close(); return nil }, nil
		}
		return rt, func() error { return nil }, nil
	}
	return &testApp{app: a, stdout: out, stderr: errb}
}

// testConfigDir is the configuration directory of tests that give no
// XDG_CONFIG_HOME: where their default group secret is made.
var testConfigDir string

// testBridge is a stand-in for the jetcrew-bridge binary (the fake runtime
// never runs it) that workers of test apps mount into coordination runs;
// TestMain creates it.
var testBridge string

// TestMain makes the stand-in bridge, and points TMPDIR at a directory of
// its own, removed at the end, so the state directories of the tests'
// workers (os.TempDir()/jetcrew-<id>) go with it. It fails the package's
// tests when a goroutine outlives them (every command's server, worker,
// console and connection included).
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "jc-cmd")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.Setenv("TMPDIR", dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testBridge = filepath.Join(dir, "jetcrew-bridge")
	testConfigDir = filepath.Join(dir, "config")
	if err := os.WriteFile(testBridge, []byte("#!/bin/false\n"), 0o555); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, append(leaktest.Known(), goleak.Cleanup(func(code int) {
		_ = os.RemoveAll(dir)
		os.Exit(code)
	}))...)
}

// cli runs one command line in a fresh app with NATS_URL=url and returns
// its exit code, stdout and stderr.
func cli(t *testing.T, url string, args ...string) (int, string, string) {
	t.Helper()
	a := newTestApp(map[string]string{"NATS_URL": url}, nil)
	code := a.run(t.Context(), args)
	return code, a.stdout.String(), a.stderr.String()
}

// startWorker runs `jetcrew worker` against s until the test ends.
func startWorker(t *testing.T, s *server.Server, args ...string) {
	t.Helper()
	startWorkerWith(t, s, workertest.NewTestRuntime(t), args...)
}

// startWorkerWith runs `jetcrew worker` with the container runtime rt
// against s until the test ends.
func startWorkerWith(t *testing.T, s *server.Server, rt jail.Runtime, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a := newTestApp(nil, rt)
	done := make(chan int, 1)
	go func() {
		done <- a.run(ctx, append([]string{"worker", "--nats", s.ClientURL()}, args...))
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			require.Equal(t, 0, code, "worker stderr: %s", a.stderr.String())
		case <-time.After(20 * time.Second):
			t.Error("worker did not stop")
		}
	})
	// The worker is ready once it created its pool's consumer and announced
	// itself in the workers bucket (its first heartbeat comes after the
	// consumer; a waiting submit that finds no live worker says so and
	// exits 1, so a test must not submit before it).
	nc := workertest.Connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	workertest.WaitWorkerReady(t, js, messages.DefaultPool, 20*time.Second, "worker stderr: %s", a.stderr.String())
}

// provisionedServer starts a server with jetcrew's streams and buckets, as
// a worker provisions them, and no worker: what a submitter meets.
func provisionedServer(t *testing.T) (*server.Server, jetstream.JetStream) {
	t.Helper()
	s := workertest.StartServer(t)
	js, err := jetstream.New(workertest.Connect(t, s))
	require.NoError(t, err)
	_, err = worker.Provision(t.Context(), js, worker.ProvisionConfig{})
	require.NoError(t, err)
	return s, js
}

func TestNATSURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, flag, env, want string
	}{
		{"default: the context's, else defaultNATSURL", "", "", ""},
		{"env", "", "nats://env:4222", "nats://env:4222"},
		{"flag beats env", "nats://flag:4222", "nats://env:4222", "nats://flag:4222"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := newTestApp(map[string]string{"NATS_URL": tt.env}, nil)
			require.Equal(t, tt.want, a.natsURL(tt.flag))
		})
	}
}

func TestNATSURLUsedByCommands(t *testing.T) {
	t.Parallel()
	// Nothing listens on port 1: the error names the URL from NATS_URL.
	code, _, stderr := cli(t, "nats://127.0.0.1:1", "status", "some-run")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "nats://127.0.0.1:1")
	require.Contains(t, stderr, "jetcrew up")

	code, _, stderr = cli(t, "nats://127.0.0.1:1", "watch", "--nats", "nats://127.0.0.1:2", "some-run")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "nats://127.0.0.1:2")
}

// Every command that takes a RUN_ID starts the same way (runDispatcher): an
// id that cannot be a run id is a usage error before any connection, and a
// good one connects to the server --nats, else NATS_URL, names.
func TestRunIDCommands(t *testing.T) {
	t.Parallel()
	badID := messages.ValidateToken("run id", "a.b")
	require.Error(t, badID)
	for _, name := range []string{"status", "watch", "cancel", "replay", "result", "diff", "apply", "artifacts"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := cli(t, "nats://127.0.0.1:1", name, "a.b")
			require.Equal(t, exitUsage, code, "stderr: %s", stderr)
			require.Empty(t, stdout)
			require.Equal(t, "jetcrew: "+badID.Error()+"\nRun 'jetcrew "+name+" --help' for usage.\n", stderr)

			code, _, stderr = cli(t, "nats://127.0.0.1:1", name, "some-run")
			require.Equal(t, 1, code, "stderr: %s", stderr)
			require.Contains(t, stderr, "connect to NATS at nats://127.0.0.1:1")

			code, _, stderr = cli(t, "nats://127.0.0.1:1", name, "--nats", "nats://127.0.0.1:2", "some-run")
			require.Equal(t, 1, code, "stderr: %s", stderr)
			require.Contains(t, stderr, "connect to NATS at nats://127.0.0.1:2")
		})
	}
}

// The command list in main.go's doc comment names every command there is,
// and only those.
func TestMainDocListsEveryCommand(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	require.NoError(t, err)
	var documented []string
	for _, line := range strings.Split(f.Doc.Text(), "\n") {
		rest, ok := strings.CutPrefix(line, "\tjetcrew ")
		if !ok {
			continue
		}
		usage, _, _ := strings.Cut(rest, "  ") // before the description
		var words []string
		for _, w := range strings.Fields(usage) {
			if strings.Trim(w, "abcdefghijklmnopqrstuvwxyz") != "" {
				break // an argument, a flag or a prompt
			}
			words = append(words, w)
		}
		if len(words) > 0 {
			documented = append(documented, strings.Join(words, " "))
		}
	}
	var registered []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if !c.HasSubCommands() || c.Runnable() { // `failed` runs, and has `failed discard`
			registered = append(registered, strings.TrimPrefix(c.CommandPath(), "jetcrew "))
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	for _, c := range newApp().rootCmd().Commands() {
		walk(c)
	}
	require.ElementsMatch(t, registered, documented)
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	require.Equal(t, "nats://127.0.0.1:4222", redactURL("nats://127.0.0.1:4222"))
	require.Equal(t, "nats://bob:xxxxx@h:4222", redactURL("nats://bob:secret@h:4222"))
	require.Equal(t, "nats://xxxxx@h:4222,nats://h2:4222", redactURL("nats://tok3n@h:4222,nats://h2:4222"))
	require.NotContains(t, redactURL("nats://a:hunter2@x,nats://b:hunter2@y"), "hunter2")
}

func TestParsePairs(t *testing.T) {
	t.Parallel()
	m, err := parsePairs("--env", []string{"A=1", "B=x=y", "C="})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"A": "1", "B": "x=y", "C": ""}, m)

	m, err = parsePairs("--env", nil)
	require.NoError(t, err)
	require.Nil(t, m)

	for _, bad := range [][]string{{"A"}, {"=v"}, {"A=1", "A=2"}} {
		_, err := parsePairs("--env", bad)
		require.Error(t, err, "%q", bad)
	}
}

func TestParseListen(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in       string
		host     string
		port     int
		wantFail bool
	}{
		{"127.0.0.1:4222", "127.0.0.1", 4222, false},
		{"127.0.0.1:0", "127.0.0.1", server.RANDOM_PORT, false},
		{":4222", "0.0.0.0", 4222, false},
		{"[::1]:5000", "::1", 5000, false},
		{"127.0.0.1", "", 0, true},
		{"127.0.0.1:x", "", 0, true},
		{"127.0.0.1:70000", "", 0, true},
	}
	for _, tt := range tests {
		host, port, err := parseListen(tt.in)
		if tt.wantFail {
			require.Error(t, err, tt.in)
			continue
		}
		require.NoError(t, err, tt.in)
		require.Equal(t, tt.host, host, tt.in)
		require.Equal(t, tt.port, port, tt.in)
	}
}

func TestRunExitCode(t *testing.T) {
	t.Parallel()
	code := func(i int) *int { return &i }
	tests := []struct {
		ev   messages.Event
		want int
	}{
		{messages.Event{State: messages.StateSucceeded, ExitCode: code(0)}, 0},
		{messages.Event{State: messages.StateFailed, ExitCode: code(3)}, 3},
		{messages.Event{State: messages.StateFailed, ExitCode: code(255)}, 255},
		{messages.Event{State: messages.StateFailed, ExitCode: code(-1)}, 1},
		{messages.Event{State: messages.StateFailed}, 1},
		{messages.Event{State: messages.StateTimedOut, ExitCode: code(143)}, 1},
		{messages.Event{State: messages.StateCancelled}, 1},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, runExitCode(tt.ev), "%+v", tt.ev)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown command", []string{"bogus"}, "unknown command"},
		{"unknown flag", []string{"submit", "--bogus", "x"}, "unknown flag"},
		{"missing prompt", []string{"submit"}, "missing argument PROMPT"},
		{"two prompts", []string{"submit", "echo", "hi"}, "quote a prompt"},
		{"bad log level", []string{"--log-level", "loud", "status", "x"}, "--log-level"},
		{"bad run id", []string{"status", "a.b"}, "run id"},
		{"bad env", []string{"submit", "--env", "NOEQUALS", "x"}, "KEY=VALUE"},
		{"bad listen", []string{"up", "--listen", "nope"}, "--listen"},
		{"bad concurrency", []string{"worker", "--concurrency", "0"}, "--concurrency"},
		{"max ack pending below concurrency", []string{"worker", "--concurrency", "8", "--max-ack-pending", "4"}, "--max-ack-pending"},
		{"missing profiles file", []string{"worker", "--profiles", "/nonexistent/profiles.toml"}, "profiles"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// NATS_URL points nowhere: a usage error must come before any
			// connection attempt.
			code, stdout, stderr := cli(t, "nats://127.0.0.1:1", tt.args...)
			require.Equal(t, exitUsage, code, "stderr: %s", stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tt.want)
			require.Contains(t, stderr, "--help' for usage")
			require.NotContains(t, stderr, "connect to NATS")
		})
	}
}

func TestSubmitRefusesInvalidBeforeConnecting(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"bad profile", []string{"--profile", "a b"}, "profile"},
		{"reserved env", []string{"--env", "JETCREW_X=1"}, "reserved"},
		{"bad env name", []string{"--env", "1X=1"}, "env name"},
		{"bad id", []string{"--id", "a.b"}, "id"},
		{"long timeout", []string{"--timeout", "48h"}, "timeout"},
		{"oversize", nil, "largest allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			prompt := "echo hi"
			if tt.name == "oversize" {
				prompt = strings.Repeat("x", messages.MaxRequestBytes)
			}
			args := append(append([]string{"submit"}, tt.args...), prompt)
			code, _, stderr := cli(t, "nats://127.0.0.1:1", args...)
			require.Equal(t, exitUsage, code, "stderr: %s", stderr)
			require.Contains(t, stderr, "invalid run request")
			require.Contains(t, stderr, tt.want)
			require.NotContains(t, stderr, "connect to NATS")
		})
	}
}

// submit --workspace checks the request before connecting and, once the
// snapshot is uploaded, only what the workspace field adds: the request
// published names the snapshot, and one that the field makes too large is a
// usage error with nothing published.
func TestSubmitWorkspaceRequest(t *testing.T) {
	t.Parallel()
	s, js := provisionedServer(t)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n"), 0o644))

	code, stdout, stderr := cli(t, s.ClientURL(), "submit", "--id", "ws-1", "--workspace", dir, "cat main.go")
	require.Equal(t, 0, code, "stderr: %s", stderr)
	require.Equal(t, "ws-1\n", stdout)
	runs, err := js.Stream(t.Context(), messages.StreamRuns)
	require.NoError(t, err)
	msg, err := runs.GetMsg(t.Context(), 1)
	require.NoError(t, err)
	req, err := messages.DecodeRunRequest(msg.Data)
	require.NoError(t, err)
	require.Equal(t, "ws-1", req.ID)
	require.NotNil(t, req.Workspace)
	require.Regexp(t, `^sha256:[0-9a-f]{64}$`, req.Workspace.Digest)
	require.Contains(t, stderr, "--- workspace "+dir+": "+req.Workspace.Name)

	// A prompt that fits alone but not beside the workspace field.
	one, err := dispatcher.Encode(messages.RunRequest{ID: "ws-big", Profile: "shell", Prompt: "x"})
	require.NoError(t, err)
	data, err := json.Marshal(one.Request())
	require.NoError(t, err)
	code, _, stderr = cli(t, s.ClientURL(), "submit", "--id", "ws-big", "--workspace", dir,
		strings.Repeat("x", messages.MaxRequestBytes-len(data)+1))
	require.Equal(t, exitUsage, code, "stderr: %s", stderr)
	require.Contains(t, stderr, "jetcrew: submit: invalid run request: encoded request is")
	require.Contains(t, stderr, "largest allowed")
	info, err := runs.Info(t.Context())
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.State.Msgs, "nothing is published for a refused request")
}

func TestSubmitNotProvisioned(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)

	code, stdout, stderr := cli(t, s.ClientURL(), "submit", "echo hi")
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "jetcrew up")

	code, _, stderr = cli(t, s.ClientURL(), "status", "x")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "jetcrew up")
}

func TestWorkerSubmitStatusWatch(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	startWorker(t, s, "--concurrency", "2", "--id", "test-worker")
	url := s.ClientURL()

	// A run that succeeds: its output is copied byte for byte.
	code, stdout, stderr := cli(t, url, "submit", "--wait", "out hello; err oops")
	require.Equal(t, 0, code, "stderr: %s", stderr)
	require.Equal(t, "hello\n", stdout)
	require.Contains(t, stderr, "oops\n")
	require.Regexp(t, `--- submitted run [0-9A-Z]{26} \(profile shell, pool default\)`, stderr)
	require.Contains(t, stderr, "--- started: attempt 1 on worker test-worker")
	require.Contains(t, stderr, "--- finished: succeeded")

	// A run that fails with exit code 3: submit exits 3.
	code, stdout, stderr = cli(t, url, "submit", "--wait", "--id", "fails", "--label", "team=qa", "out before; exit 3")
	require.Equal(t, 3, code, "stderr: %s", stderr)
	require.Equal(t, "before\n", stdout)
	require.Contains(t, stderr, "--- finished: failed (exit code 3)")

	// --quiet: no lifecycle lines, but the outcome is said.
	code, _, stderr = cli(t, url, "submit", "--wait", "-q", "exit 4")
	require.Equal(t, 4, code)
	require.NotContains(t, stderr, "---")
	require.Regexp(t, `jetcrew: run \S+ failed \(exit code 4\)`, stderr)

	// status --json prints the state record.
	code, stdout, stderr = cli(t, url, "status", "--json", "fails")
	require.Equal(t, 0, code, "stderr: %s", stderr)
	var st messages.RunState
	require.NoError(t, json.Unmarshal([]byte(stdout), &st))
	require.Equal(t, "fails", st.ID)
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, 3, *st.ExitCode)
	require.Equal(t, 1, st.Attempts)
	require.Equal(t, "test-worker", st.Worker)
	require.Equal(t, map[string]string{"team": "qa"}, st.Labels)

	// status for people.
	code, stdout, _ = cli(t, url, "status", "fails")
	require.Equal(t, 0, code)
	for _, want := range []string{"id:", "fails", "state:", "failed", "exit code:", "3", "attempts:", "profile:", "shell", "worker:", "test-worker", "reason:", "labels:", "team=qa"} {
		require.Contains(t, stdout, want)
	}

	// watch replays a finished run and exits with its outcome.
	code, stdout, stderr = cli(t, url, "watch", "fails")
	require.Equal(t, 3, code)
	require.Equal(t, "before\n", stdout)
	require.Contains(t, stderr, "--- finished: failed (exit code 3)")

	// Without --wait: the id alone on stdout, at once; watch follows it.
	code, stdout, stderr = cli(t, url, "submit", "--timeout", "30s", "out later")
	require.Equal(t, 0, code, "stderr: %s", stderr)
	id := strings.TrimSpace(stdout)
	require.Regexp(t, regexp.MustCompile(`^[0-9A-Z]{26}$`), id)
	code, stdout, _ = cli(t, url, "watch", id)
	require.Equal(t, 0, code)
	require.Equal(t, "later\n", stdout)

	// An unknown run.
	code, _, stderr = cli(t, url, "status", "nope")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "run not found")
}

func TestSubmitPromptFromStdin(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	startWorker(t, s)

	a := newTestApp(map[string]string{"NATS_URL": s.ClientURL()}, nil)
	a.stdin = strings.NewReader("out from stdin")
	code := a.run(t.Context(), []string{"submit", "--wait", "-"})
	require.Equal(t, 0, code, "stderr: %s", a.stderr.String())
	require.Equal(t, "from stdin\n", a.stdout.String())
}

func TestUp(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	up := newTestApp(nil, workertest.NewTestRuntime(t))
	done := make(chan int, 1)
	go func() {
		done <- up.run(ctx, []string{"up", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--concurrency", "1"})
	}()

	var url string
	require.Eventually(t, func() bool {
		m := regexp.MustCompile(`(?m)^NATS_URL=(nats://127\.0\.0\.1:\d+)$`).FindStringSubmatch(up.stdout.String())
		if m == nil {
			return false
		}
		url = m[1]
		return true
	}, 15*time.Second, 20*time.Millisecond, "stderr: %s", up.stderr.String())
	require.NotContains(t, url, ":4222")

	code, stdout, stderr := cli(t, url, "submit", "--wait", "out via up")
	require.Equal(t, 0, code, "stderr: %s", stderr)
	require.Equal(t, "via up\n", stdout)

	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code, "stderr: %s", up.stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatal("up did not stop")
	}
	require.Contains(t, up.stderr.String(), "nats-server stopped")
}

func TestUpPortInUse(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()

	up := newTestApp(nil, workertest.NewTestRuntime(t))
	start := time.Now()
	code := up.run(t.Context(), []string{"up", "--listen", l.Addr().String(), "--data", t.TempDir()})
	require.Equal(t, 1, code)
	require.Contains(t, up.stderr.String(), "nats-server")
	require.Less(t, time.Since(start), 8*time.Second, "a fatal server error must not wait for the readiness timeout")
	require.Empty(t, up.stdout.String())
}

func TestUpRuntimeUnavailable(t *testing.T) {
	t.Parallel()
	up := newTestApp(nil, nil)
	up.newRuntime = func(context.Context, zerolog.Logger) (jail.Runtime, func() error, error) {
		return nil, nil, errFakeDocker
	}
	code := up.run(t.Context(), []string{"up", "--listen", "127.0.0.1:0", "--data", t.TempDir()})
	require.Equal(t, 1, code)
	require.Contains(t, up.stderr.String(), "container runtime: no docker here")
	require.Empty(t, up.stdout.String(), "no URL is printed when the worker cannot start")
}

var errFakeDocker = &fakeErr{"no docker here"}

type fakeErr struct{ s string }

func (e *fakeErr) Error() string { return e.s }

// consumerInfo returns the default pool's consumer as the server has it.
func consumerInfo(t *testing.T, nc *nats.Conn) *jetstream.ConsumerInfo {
	t.Helper()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	c, err := js.Consumer(t.Context(), messages.StreamRuns, messages.ConsumerName(messages.DefaultPool))
	require.NoError(t, err)
	info, err := c.Info(t.Context())
	require.NoError(t, err)
	return info
}
