package main

import (
	"bytes"
	"context"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jetcrew/jetcrew/internal/leaktest"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
)

// stdoutTap drains a bridge's stdout: it records every byte, to check
// afterwards that stdout held JSON-RPC frames only, and forwards them to the
// MCP client through a buffer that never blocks the bridge.
type stdoutTap struct {
	mu     sync.Mutex
	cond   *sync.Cond
	all    bytes.Buffer // everything the bridge wrote
	unread bytes.Buffer // what the client has not read yet
	eof    bool
	done   chan struct{}
}

func tapStdout(r io.Reader) *stdoutTap {
	tp := &stdoutTap{done: make(chan struct{})}
	tp.cond = sync.NewCond(&tp.mu)
	go func() {
		// Ends when the bridge's stdout closes (the bridge exited).
		defer close(tp.done)
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			tp.mu.Lock()
			tp.all.Write(buf[:n])
			tp.unread.Write(buf[:n])
			if err != nil {
				tp.eof = true
			}
			tp.cond.Broadcast()
			tp.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return tp
}

// Read implements io.Reader for the client.
func (tp *stdoutTap) Read(p []byte) (int, error) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for tp.unread.Len() == 0 && !tp.eof {
		tp.cond.Wait()
	}
	if tp.unread.Len() == 0 {
		return 0, io.EOF
	}
	return tp.unread.Read(p)
}

func (tp *stdoutTap) Close() error { return nil }

// waitLines waits until the bridge has written n lines.
func (tp *stdoutTap) waitLines(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		tp.mu.Lock()
		defer tp.mu.Unlock()
		return bytes.Count(tp.all.Bytes(), []byte("\n")) >= n
	}, 10*time.Second, 5*time.Millisecond)
}

// requireFramesOnly waits for stdout to close and checks that every line the
// bridge wrote is a JSON-RPC message, and that it wrote nothing else.
func (tp *stdoutTap) requireFramesOnly(t *testing.T) int {
	t.Helper()
	select {
	case <-tp.done:
	case <-time.After(30 * time.Second):
		t.Fatal("bridge stdout did not close")
	}
	tp.mu.Lock()
	out := tp.all.String()
	tp.mu.Unlock()
	if out == "" {
		return 0
	}
	require.True(t, strings.HasSuffix(out, "\n"), "stdout ends mid-line: %q", out[max(0, len(out)-200):])
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i, line := range lines {
		_, err := jsonrpc.DecodeMessage([]byte(line))
		require.NoError(t, err, "stdout line %d is not a JSON-RPC message: %q", i+1, line)
	}
	return len(lines)
}

// syncBuffer is a bytes.Buffer safe for concurrent use, for stderr.
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

// bridgeRun is run() started in process on pipes.
type bridgeRun struct {
	stdin  *io.PipeWriter
	tap    *stdoutTap
	stderr *syncBuffer
	cancel context.CancelFunc // what SIGTERM does in main
	code   chan int
}

func startRun(t *testing.T, socket string) *bridgeRun {
	t.Helper()
	return startRunEnv(t, map[string]string{relay.EnvSocket: socket})
}

// startRunEnv is startRun with the bridge's environment env.
func startRunEnv(t *testing.T, env map[string]string) *bridgeRun {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	br := &bridgeRun{stdin: inW, tap: tapStdout(outR), stderr: &syncBuffer{}, cancel: cancel, code: make(chan int, 1)}
	go func() {
		code := run(ctx, nil, inR, outW, br.stderr, func(k string) string { return env[k] })
		_ = outW.Close()
		_ = inR.Close()
		br.code <- code
	}()
	t.Cleanup(func() {
		cancel()
		_ = inW.Close()
	})
	return br
}

func (br *bridgeRun) client(t *testing.T) *mcp.ClientSession {
	t.Helper()
	return connectClient(t, br.tap, br.stdin)
}

func (br *bridgeRun) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case c := <-br.code:
		return c
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return")
		return -1
	}
}

func connectClient(t *testing.T, r io.ReadCloser, w io.WriteCloser) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "test"}, nil)
	cs, err := c.Connect(ctx, &mcp.IOTransport{Reader: r, Writer: w}, nil)
	require.NoError(t, err)
	return cs
}

// world is a provisioned NATS server with a Host serving runs "a" and "b"
// of group "g"; it returns the server and the sockets.
func world(t *testing.T) (*server.Server, string, string) {
	t.Helper()
	srv, sessions := worldSessions(t)
	return srv, sessions[0].SocketPath(), sessions[1].SocketPath()
}

// worldSessions is world, returning the sessions of "a" and "b".
func worldSessions(t *testing.T) (*server.Server, []*coordination.Session) {
	t.Helper()
	srv, _, _ := coordtest.Provisioned(t)
	h, err := coordination.NewHost(coordtest.Connect(t, srv), coordination.Config{OpTimeout: time.Second})
	require.NoError(t, err)
	dir := coordtest.SocketDir(t)
	var sessions []*coordination.Session
	for _, id := range []string{"a", "b"} {
		path := coordtest.SocketPath(dir, id)
		s, err := h.Serve(context.Background(), coordination.RunInfo{RunID: id, Group: "g", Profile: "shell"}, path)
		require.NoError(t, err)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			_ = s.Close(ctx)
		})
		sessions = append(sessions, s)
	}
	return srv, sessions
}

func TestRunNormalUse(t *testing.T) {
	t.Parallel()
	_, sessions := worldSessions(t)
	sockA, sockB := sessions[0].SocketPath(), sessions[1].SocketPath()
	a, b := startRun(t, sockA), startRun(t, sockB)
	// The bridge announces itself before any tool call.
	require.Eventually(t, sessions[0].Connected, 5*time.Second, 5*time.Millisecond)
	ca, cb := a.client(t), b.client(t)

	st := coordtest.Decode[relay.Status](t, ca, "status", map[string]any{})
	require.Equal(t, "a", st.RunID)
	require.Len(t, st.Peers, 1)
	sent := coordtest.Decode[relay.SendResponse](t, ca, "send", map[string]any{"to": "b", "body": "hi b"})
	got := coordtest.Decode[relay.InboxResponse](t, cb, "inbox", map[string]any{"wait_seconds": 5})
	require.Len(t, got.Messages, 1)
	require.Equal(t, sent.MessageID, got.Messages[0].ID)
	require.Equal(t, "a", got.Messages[0].From)

	require.NoError(t, ca.Close())
	require.NoError(t, cb.Close())
	require.Equal(t, 0, a.exitCode(t))
	require.Equal(t, 0, b.exitCode(t))
	require.GreaterOrEqual(t, a.tap.requireFramesOnly(t), 3, "initialize, status and send answers")
	b.tap.requireFramesOnly(t)
	require.Contains(t, a.stderr.String(), "jetcrew-bridge starting")
}

// With no reconnect window (JETCREW_BRIDGE_RECONNECT=0), a socket nobody
// serves fails every call at once.
func TestRunSocketMissing(t *testing.T) {
	t.Parallel()
	br := startRunEnv(t, map[string]string{relay.EnvSocket: filepath.Join(coordtest.SocketDir(t), "missing.sock"), relay.EnvReconnectWindow: "0"})
	cs := br.client(t)
	tools, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	requireToolNames(t, tools.Tools)
	for tool, args := range map[string]any{
		"status": map[string]any{},
		"send":   map[string]any{"to": "all", "body": "x"},
		"inbox":  map[string]any{},
	} {
		res := coordtest.Call(t, cs, tool, args)
		require.True(t, res.IsError)
		require.True(t, strings.HasPrefix(coordtest.Text(res), "coordination unavailable: "), coordtest.Text(res))
	}
	require.NoError(t, cs.Close())
	require.Equal(t, 0, br.exitCode(t))
	br.tap.requireFramesOnly(t)
	require.Contains(t, br.stderr.String(), "tool calls will fail")
}

// rawFrames writes lines to the bridge's stdin as they are.
func rawFrames(t *testing.T, br *bridgeRun, lines ...string) {
	t.Helper()
	for _, l := range lines {
		_, err := io.WriteString(br.stdin, l+"\n")
		if err != nil {
			return // the bridge gave up reading, as it may on garbage
		}
	}
}

const (
	initFrame        = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`
	initializedFrame = `{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}`
)

func TestRunBadInput(t *testing.T) {
	t.Parallel()
	_, sockA, _ := world(t)
	call := func(args string) string {
		return `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":` + args + `}`
	}
	tests := []struct {
		name   string
		lines  []string
		frames int    // answers expected before stdin closes; -1: the session ends on its own
		want   string // in stdout
	}{
		{"not json", []string{initFrame, initializedFrame, `this is not json`}, -1, ""},
		{"not json-rpc", []string{initFrame, initializedFrame, `{"hello":"world"}`}, -1, ""},
		{"binary", []string{initFrame, "\x00\xff\xfe{{{"}, -1, ""},
		{"oversize frame", []string{initFrame, initializedFrame, call(`{"name":"send","arguments":{"to":"b","body":"` + strings.Repeat("z", 2<<20) + `"}}`)}, -1, ""},
		{"truncated", []string{initFrame, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":`}, 1, ""},
		{"before init", []string{call(`{"name":"status","arguments":{}}`)}, 1, ""},
		{"unknown method", []string{initFrame, initializedFrame, `{"jsonrpc":"2.0","id":2,"method":"nope/nope","params":{}}`}, 2, `"error"`},
		{"bad arguments", []string{initFrame, initializedFrame, call(`{"name":"send","arguments":{"to":5,"body":[]}}`)}, 2, `"isError":true`},
		{"unknown tool", []string{initFrame, initializedFrame, call(`{"name":"rm","arguments":{}}`)}, 2, `"error"`},
		{"oversize body", []string{initFrame, initializedFrame, call(`{"name":"send","arguments":{"to":"b","body":"` + strings.Repeat("z", 20<<10) + `"}}`)}, 2, "largest allowed is 16384 bytes"},
		{"forged from", []string{initFrame, initializedFrame, call(`{"name":"send","arguments":{"to":"b","body":"x","from":"b"}}`)}, 2, `"isError":true`},
		{"valid", []string{initFrame, initializedFrame, call(`{"name":"status","arguments":{}}`)}, 2, `\"run_id\":\"a\"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			br := startRun(t, sockA)
			rawFrames(t, br, tt.lines...)
			if tt.frames >= 0 {
				br.tap.waitLines(t, tt.frames)
			}
			_ = br.stdin.Close()
			code := br.exitCode(t)
			n := br.tap.requireFramesOnly(t)
			switch {
			case tt.frames < 0:
				require.Equal(t, 1, code, "a broken frame ends the session")
				require.Contains(t, br.stderr.String(), "session failed")
			case tt.name == "truncated":
				require.Equal(t, 1, code, "stdin ended mid-frame")
				require.Equal(t, tt.frames, n)
			default:
				require.Equal(t, 0, code)
				require.Equal(t, tt.frames, n)
			}
			require.Contains(t, br.tap.all.String(), tt.want)
		})
	}
}

func TestRunNATSDown(t *testing.T) {
	t.Parallel()
	srv, sockA, _ := world(t)
	br := startRun(t, sockA)
	cs := br.client(t)
	srv.Shutdown()
	srv.WaitForShutdown()
	for tool, args := range map[string]any{
		"status": map[string]any{},
		"send":   map[string]any{"to": "all", "body": "x"},
		"inbox":  map[string]any{},
	} {
		res := coordtest.Call(t, cs, tool, args)
		require.True(t, res.IsError)
		require.True(t, strings.HasPrefix(coordtest.Text(res), "coordination unavailable: "), coordtest.Text(res))
	}
	require.NoError(t, cs.Close())
	require.Equal(t, 0, br.exitCode(t))
	br.tap.requireFramesOnly(t)
}

func TestRunStopsOnSignal(t *testing.T) {
	t.Parallel()
	srv, sockA, _ := world(t)
	br := startRun(t, sockA)
	cs := br.client(t)
	// A long poll is in flight when the signal comes.
	go func() {
		_, _ = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "inbox", Arguments: map[string]any{"wait_seconds": 30}})
	}()
	coordtest.WaitLongPoll(t, srv, "a")
	start := time.Now()
	br.cancel()
	require.Equal(t, 0, br.exitCode(t))
	require.Less(t, time.Since(start), 10*time.Second)
	_ = br.stdin.Close()
	br.tap.requireFramesOnly(t)
}

func TestRunRefusesArguments(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"--help"}, strings.NewReader(""), &stdout, &stderr, func(string) string { return "" })
	require.Equal(t, 2, code)
	require.Empty(t, stdout.String())
	require.Contains(t, stderr.String(), "takes no arguments")
}

// binDir holds the bridge binary the tests build; TestMain removes it.
var binDir string

// TestMain fails the package's tests when a goroutine outlives them (the
// in-process bridges, their tool calls and stdout taps included), then
// removes binDir.
func TestMain(m *testing.M) {
	var err error
	if binDir, err = os.MkdirTemp("", "jetcrew-bridge-test"); err != nil {
		panic(err)
	}
	goleak.VerifyTestMain(m, append(leaktest.Known(), goleak.Cleanup(func(code int) {
		_ = os.RemoveAll(binDir)
		os.Exit(code)
	}))...)
}

// buildBridge builds the real binary, static (CGO_ENABLED=0), once per test
// binary run: the jetcrew binary, named "bridge" as the worker mounts it in
// a run container, so the binary tests run the entry point runs use.
var buildBridge = sync.OnceValues(func() (string, error) {
	bin := filepath.Join(binDir, "bridge")
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		goTool = "go"
	}
	cmd := exec.Command(goTool, "build", "-o", bin, "../jetcrew")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", &buildError{err: err, out: string(out)}
	}
	return bin, nil
})

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

// execBridge starts the built binary with JETCREW_BRIDGE_SOCKET=socket and
// env.
func execBridge(t *testing.T, socket string, env ...string) (*exec.Cmd, io.WriteCloser, *stdoutTap, *syncBuffer) {
	t.Helper()
	bin, err := buildBridge()
	require.NoError(t, err)
	cmd := exec.Command(bin)
	cmd.Env = append([]string{relay.EnvSocket + "=" + socket}, env...)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd, stdin, tapStdout(stdout), stderr
}

func TestBinary(t *testing.T) {
	t.Parallel()
	srv, sockA, sockB := world(t)
	cmdA, inA, tapA, errA := execBridge(t, sockA)
	cmdB, inB, tapB, _ := execBridge(t, sockB)
	ca, cb := connectClient(t, tapA, inA), connectClient(t, tapB, inB)

	sent := coordtest.Decode[relay.SendResponse](t, ca, "send", map[string]any{"to": "b", "body": "over stdio"})
	got := coordtest.Decode[relay.InboxResponse](t, cb, "inbox", map[string]any{"wait_seconds": 5})
	require.Len(t, got.Messages, 1)
	require.Equal(t, sent.MessageID, got.Messages[0].ID)
	require.Equal(t, "a", got.Messages[0].From)
	res := coordtest.Call(t, ca, "send", map[string]any{"to": "b", "body": strings.Repeat("x", 20<<10)})
	require.True(t, res.IsError)
	require.Contains(t, coordtest.Text(res), "16384")

	// SIGTERM while a long poll is in flight: a prompt, clean exit.
	go func() {
		_, _ = cb.CallTool(context.Background(), &mcp.CallToolParams{Name: "inbox", Arguments: map[string]any{"wait_seconds": 30}})
	}()
	coordtest.WaitLongPoll(t, srv, "b")
	start := time.Now()
	require.NoError(t, cmdB.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmdB.Wait())
	require.Less(t, time.Since(start), 10*time.Second)
	tapB.requireFramesOnly(t)

	// Closing stdin ends the other one.
	require.NoError(t, ca.Close())
	require.NoError(t, cmdA.Wait())
	tapA.requireFramesOnly(t)
	require.Contains(t, errA.String(), "jetcrew-bridge starting")
}

// A socket nobody serves: the call waits for it the reconnect window that
// JETCREW_BRIDGE_RECONNECT sets, then fails "coordination unavailable".
func TestBinarySocketMissing(t *testing.T) {
	t.Parallel()
	cmd, in, tap, stderr := execBridge(t, filepath.Join(coordtest.SocketDir(t), "nope.sock"), relay.EnvReconnectWindow+"=2s")
	cs := connectClient(t, tap, in)
	tools, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	requireToolNames(t, tools.Tools)
	start := time.Now()
	res := coordtest.Call(t, cs, "status", map[string]any{})
	took := time.Since(start)
	require.True(t, res.IsError)
	require.True(t, strings.HasPrefix(coordtest.Text(res), "coordination unavailable: "), coordtest.Text(res))
	require.Contains(t, coordtest.Text(res), "for it to come back")
	require.Greater(t, took, time.Second, "the call waited for the socket")
	require.Less(t, took, 10*time.Second, "the call waited no longer than its window")
	// Garbage on stdin ends the session; stdout still holds frames only.
	_, _ = io.WriteString(in, "garbage\n")
	err = cmd.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 1, ee.ExitCode())
	tap.requireFramesOnly(t)
	require.Contains(t, stderr.String(), "session failed")
}

func TestBinaryIsStatic(t *testing.T) {
	t.Parallel()
	bin, err := buildBridge()
	require.NoError(t, err)
	f, err := elf.Open(bin)
	require.NoError(t, err)
	defer f.Close()
	for _, p := range f.Progs {
		require.NotEqual(t, elf.PT_INTERP, p.Type, "the bridge must be static: it runs in images without a libc")
	}
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	require.Empty(t, libs)
}

func TestLogLevel(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"debug": "DEBUG", "WARN": "WARN", "error": "ERROR", "": "INFO", "bogus": "INFO"} {
		require.Equal(t, want, logLevel(in).String(), in)
	}
}

// requireToolNames requires the bridge's whole tool list (docs/wire.md),
// whether or not its socket answers.
func requireToolNames(t *testing.T, tools []*mcp.Tool) {
	t.Helper()
	var names []string
	for _, tool := range tools {
		names = append(names, tool.Name)
	}
	require.ElementsMatch(t, []string{"status", "send", "inbox", "claim", "release", "claims", "ask", "reply"}, names)
}
