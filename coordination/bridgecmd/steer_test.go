package bridgecmd

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

// fakeWorker serves the steering endpoints of a run's socket: each steer
// given is handed to the first long poll, and the acknowledgements and the
// "input closed" report are recorded.
type fakeWorker struct {
	// ackDelay is how long an acknowledgement takes to be answered.
	ackDelay time.Duration

	mu     sync.Mutex
	steers []relay.Steer
	acks   []relay.SteerAck
	closed bool
	// order is "ack <id>" and "closed" in the order the worker took them.
	order []string
}

func (f *fakeWorker) serve(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sock")
	srv := f.serveAt(t, path)
	t.Cleanup(func() { _ = srv.Close() })
	return path
}

// serveAt serves the steering endpoints on a new socket at path until the
// server returned is closed (which removes the socket file).
func (f *fakeWorker) serveAt(t *testing.T, path string) *http.Server {
	t.Helper()
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+relay.PathSteerNext, func(w http.ResponseWriter, r *http.Request) {
		var req relay.SteerNextRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		resp := relay.SteerNextResponse{Steers: f.steers}
		f.steers = nil
		f.closed = f.closed || req.Closed
		if req.Closed {
			f.order = append(f.order, "closed")
		}
		f.mu.Unlock()
		if len(resp.Steers) == 0 && !req.Closed {
			time.Sleep(100 * time.Millisecond)
		}
		_ = json.NewEncoder(w).Encode(resp)
	})
	mux.HandleFunc("POST "+relay.PathSteerAck, func(w http.ResponseWriter, r *http.Request) {
		var a relay.SteerAck
		_ = json.NewDecoder(r.Body).Decode(&a)
		time.Sleep(f.ackDelay)
		f.mu.Lock()
		f.acks = append(f.acks, a)
		f.order = append(f.order, "ack "+a.ID)
		f.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	return srv
}

// fakeCLI is a CLI taking Claude Code's stream-json input: for each line
// read, after a second, it prints the line and a result event; it exits 0
// when its input ends.
const fakeCLI = `while read -r l; do sleep 1; printf '{"type":"assistant","got":%s}\n' "$l"; echo '{"type":"result","subtype":"success"}'; done; echo '{"type":"eof"}'`

// socketClient is a relay client of socket waiting window for it, closed
// when the test ends.
func socketClient(t *testing.T, socket string, window time.Duration) *relay.Client {
	t.Helper()
	c := relay.NewClientWith(socket, relay.ClientOptions{ReconnectWindow: window})
	t.Cleanup(c.Close)
	return c
}

func steered(t *testing.T, socket string) (string, int, time.Duration) {
	t.Helper()
	return steeredOn(t, socketClient(t, socket, relay.ReconnectWindow))
}

// steeredOn runs fakeCLI under the steered launcher with client.
func steeredOn(t *testing.T, client *relay.Client) (string, int, time.Duration) {
	t.Helper()
	prompt := filepath.Join(t.TempDir(), "prompt")
	require.NoError(t, os.WriteFile(prompt, []byte("the task"), 0o600))
	var out, errb bytes.Buffer
	start := time.Now()
	code := launchSteered("/bin/sh", []string{"sh", "-c", fakeCLI}, os.Environ(), prompt,
		steerFormats[messages.SteerInputClaude], client, &out, &errb)
	return out.String(), code, time.Since(start)
}

func TestSteeredLaunchWritesASteerAsATurnOfItsOwn(t *testing.T) {
	t.Parallel()
	f := &fakeWorker{steers: []relay.Steer{{ID: "s1", Text: "also update the docs"}}}
	out, code, took := steered(t, f.serve(t))
	require.Equal(t, 0, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 5, out)
	require.Contains(t, lines[0], `"text":"the task"`)
	require.Contains(t, lines[2], `"text":"also update the docs"`)
	require.Equal(t, `{"type":"eof"}`, lines[4], "the input closed after the steer's turn")
	require.Less(t, took, 10*time.Second)
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Equal(t, []relay.SteerAck{{ID: "s1", Delivered: true}}, f.acks)
	require.True(t, f.closed, "the launcher reports the input closed")
}

// A CLI that answers a steer at once and exits while the launcher's
// acknowledgement is still on its way: the steer was written, so the
// worker hears it delivered, before the input's "closed" report (TestSteer
// failed under load with the steer reported queued: the acknowledgement
// was cut off by the CLI's exit, and "closed" answered it).
func TestSteerAckOutlivesTheCLI(t *testing.T) {
	t.Parallel()
	f := &fakeWorker{ackDelay: 500 * time.Millisecond, steers: []relay.Steer{{ID: "s1", Text: "also update the docs"}}}
	prompt := filepath.Join(t.TempDir(), "prompt")
	require.NoError(t, os.WriteFile(prompt, []byte("the task"), 0o600))
	var out, errb bytes.Buffer
	const cli = `read -r p; read -r s; echo '{"type":"result","subtype":"success"}'; echo '{"type":"result","subtype":"success"}'`
	code := launchSteered("/bin/sh", []string{"sh", "-c", cli}, os.Environ(), prompt,
		steerFormats[messages.SteerInputClaude], socketClient(t, f.serve(t), relay.ReconnectWindow), &out, &errb)
	require.Equal(t, 0, code, errb.String())
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Equal(t, []string{"ack s1", "closed"}, f.order, "the acknowledgement reaches the worker before the input's close")
	require.Equal(t, []relay.SteerAck{{ID: "s1", Delivered: true}}, f.acks)
}

func TestSteeredLaunchClosesTheInputAfterAQuietTurn(t *testing.T) {
	t.Parallel()
	f := &fakeWorker{}
	out, code, took := steered(t, f.serve(t))
	require.Equal(t, 0, code)
	require.Equal(t, 3, strings.Count(out, "\n"), out)
	require.Less(t, took, 5*time.Second)
}

func TestSteeredLaunchWithoutASocketStillRuns(t *testing.T) {
	t.Parallel()
	out, code, _ := steeredOn(t, socketClient(t, filepath.Join(t.TempDir(), "none.sock"), 0))
	require.Equal(t, 0, code)
	require.Contains(t, out, `"type":"result"`)
}

func TestSteerAfterTheInputClosedIsRefused(t *testing.T) {
	t.Parallel()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	in := newAgentInput(w, steerFormats[messages.SteerInputKimi])
	require.NoError(t, in.write("prompt"))
	require.NoError(t, in.steer("first"))
	in.turnEnded() // the prompt's turn; the first steer's is owed: open
	require.NoError(t, in.steer("second"))
	in.turnEnded() // the first steer's; the second's is owed: open
	require.False(t, in.isClosed())
	in.turnEnded() // the second steer's: nothing owed, closed
	require.ErrorContains(t, in.steer("third"), "input is closed")
	b := make([]byte, 4096)
	n, _ := r.Read(b)
	require.Equal(t, "{\"role\":\"user\",\"content\":\"prompt\"}\n{\"role\":\"user\",\"content\":\"first\"}\n{\"role\":\"user\",\"content\":\"second\"}\n", string(b[:n]))
}

func TestTurnEnds(t *testing.T) {
	t.Parallel()
	claude, kimi := steerFormats[messages.SteerInputClaude], steerFormats[messages.SteerInputKimi]
	require.True(t, claude.ended([]byte(`{"type":"result","result":"done"}`), false))
	require.True(t, claude.ended([]byte(`{"type":"result","result":"very lo`), true))
	require.False(t, claude.ended([]byte(`{"type":"assistant","message":{"content":"{\"type\":\"result\"}"}}`), false))
	require.True(t, kimi.ended([]byte(`{"role":"assistant","content":"done"}`), false))
	require.False(t, kimi.ended([]byte(`{"role":"assistant","content":"","tool_calls":[{"id":"1"}]}`), false))
	require.False(t, kimi.ended([]byte(`{"role":"tool","content":"x"}`), false))
}

// A CLI that took the steers written during a turn into that turn prints
// no turn of theirs: the input closes after quietFor of silence, and any
// output meanwhile disarms it.
func TestQuietAfterTurnClosesTheInput(t *testing.T) {
	t.Parallel()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	in := newAgentInput(w, steerFormats[messages.SteerInputClaude])
	in.quietFor = 200 * time.Millisecond
	require.NoError(t, in.write("prompt"))
	require.NoError(t, in.steer("taken into the turn"))
	in.turnEnded()
	in.activity() // output: a turn of the steer's began
	time.Sleep(400 * time.Millisecond)
	require.False(t, in.isClosed(), "output disarmed the quiet timer")
	require.NoError(t, in.steer("again"))
	in.turnEnded()
	select {
	case <-in.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the input stayed open after a quiet turn")
	}
}

func TestExitCodeOfASignalledCLI(t *testing.T) {
	t.Parallel()
	prompt := filepath.Join(t.TempDir(), "prompt")
	require.NoError(t, os.WriteFile(prompt, []byte("x"), 0o600))
	var out, errb bytes.Buffer
	code := launchSteered("/bin/sh", []string{"sh", "-c", "kill -9 $$"}, os.Environ(), prompt,
		steerFormats[messages.SteerInputClaude], socketClient(t, filepath.Join(t.TempDir(), "none.sock"), 0), &out, &errb)
	require.Equal(t, 128+9, code)
}

// A steer written while the quiet timer runs starts the silence again:
// the timer armed before it closes nothing, so the steer keeps its turn.
func TestSteerWrittenDuringTheQuietRestartsIt(t *testing.T) {
	t.Parallel()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	go func() { _, _ = io.Copy(io.Discard, r) }()
	in := newAgentInput(w, steerFormats[messages.SteerInputClaude])
	in.quietFor = time.Second
	require.NoError(t, in.write("prompt"))
	require.NoError(t, in.steer("taken into the turn"))
	in.turnEnded() // one turn owed: the quiet timer runs
	time.Sleep(600 * time.Millisecond)
	require.NoError(t, in.steer("late"))
	time.Sleep(600 * time.Millisecond)
	require.False(t, in.isClosed(), "the timer armed before the steer closed the input")
	select {
	case <-in.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the input stayed open after the silence")
	}
}

// The worker is replaced while the agent works on its prompt: the
// launcher's steer poll waits for the socket, and a steer the new worker
// hands out reaches the agent as a turn of its own, once. (The launcher
// re-polled every second before the client waited for its socket: this
// guards the behaviour rather than shows a change.)
func TestSteerAfterTheWorkerWasReplaced(t *testing.T) {
	t.Parallel()
	f := &fakeWorker{}
	path := filepath.Join(t.TempDir(), "s.sock")
	old := f.serveAt(t, path)
	prompt := filepath.Join(t.TempDir(), "prompt")
	require.NoError(t, os.WriteFile(prompt, []byte("the task"), 0o600))
	// A first turn of 3 s, then a turn per line read.
	const cli = `read -r p; sleep 3; echo '{"type":"result","n":1}'; while read -r l; do printf '{"type":"assistant","got":%s}\n' "$l"; echo '{"type":"result"}'; done`
	var out, errb bytes.Buffer
	code := make(chan int, 1)
	client := socketClient(t, path, relay.ReconnectWindow)
	go func() {
		code <- launchSteered("/bin/sh", []string{"sh", "-c", cli}, os.Environ(), prompt,
			steerFormats[messages.SteerInputClaude], client, &out, &errb)
	}()
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, old.Close()) // the worker goes; its socket file with it
	time.Sleep(time.Second)
	f.mu.Lock()
	f.steers = []relay.Steer{{ID: "s1", Text: "after the restart"}}
	f.mu.Unlock()
	srv := f.serveAt(t, path)
	t.Cleanup(func() { _ = srv.Close() })
	require.Equal(t, 0, <-code, errb.String())
	require.Equal(t, 1, strings.Count(out.String(), `"text":"after the restart"`), out.String())
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Equal(t, []relay.SteerAck{{ID: "s1", Delivered: true}}, f.acks)
	require.True(t, f.closed)
}
