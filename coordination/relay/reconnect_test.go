package relay_test

import (
	"context"
	"encoding/json"
	"errors"
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
)

// replacedWorker serves a handler on a unix socket that can go away and
// come back at the same path, as a run's socket does while its worker is
// replaced by a successor on the same host.
type replacedWorker struct {
	t    *testing.T
	path string
	h    http.Handler

	mu  sync.Mutex
	srv *http.Server
}

// newReplacedWorker serves h on a socket in a short temp dir.
func newReplacedWorker(t *testing.T, h http.Handler) *replacedWorker {
	t.Helper()
	dir, err := os.MkdirTemp("", "jcr")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	w := &replacedWorker{t: t, path: filepath.Join(dir, "s.sock"), h: h}
	w.start()
	t.Cleanup(func() { w.stop(false) })
	return w
}

// start serves the socket, replacing a stale socket file as the worker
// does.
func (w *replacedWorker) start() {
	w.mu.Lock()
	defer w.mu.Unlock()
	_ = os.Remove(w.path)
	ln, err := net.Listen("unix", w.path)
	require.NoError(w.t, err)
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	srv := &http.Server{Handler: w.h}
	w.srv = srv
	go func() { _ = srv.Serve(ln) }()
}

// stop closes the listener and every connection; the socket file is left
// behind when stale (a killed worker's: connecting is refused), else
// removed (a worker that stopped: the path does not exist).
func (w *replacedWorker) stop(stale bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.srv == nil {
		return
	}
	_ = w.srv.Close()
	w.srv = nil
	if !stale {
		_ = os.Remove(w.path)
	}
}

// statusHandler answers status for run r1.
var statusHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_ = json.NewEncoder(w).Encode(relay.Status{RunID: "r1", Peers: []relay.Peer{}})
})

// A status call made while the worker is away waits for it, and succeeds
// once it serves the socket again, whether the old socket file was removed
// (ENOENT) or left behind by a killed worker (ECONNREFUSED).
func TestCallWaitsForTheWorkerToComeBack(t *testing.T) {
	t.Parallel()
	for name, stale := range map[string]bool{"removed": false, "stale": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := newReplacedWorker(t, statusHandler)
			c := relay.NewClientWith(w.path, relay.ClientOptions{ReconnectWindow: 20 * time.Second})
			defer c.Close()
			_, err := c.Status(context.Background()) // a kept-alive connection, which the stop cuts
			require.NoError(t, err)

			w.stop(stale)
			time.AfterFunc(1500*time.Millisecond, w.start)
			start := time.Now()
			st, err := c.Status(context.Background())
			took := time.Since(start)
			require.NoError(t, err)
			require.Equal(t, "r1", st.RunID)
			require.Greater(t, took, time.Second, "the call waited for the socket")
			require.Less(t, took, 5*time.Second, "the call noticed the socket soon after it came back")
		})
	}
}

// A worker away for longer than the window: the call fails with
// ErrUnavailable once the window has passed, saying how long it waited.
func TestCallFailsPastTheWindow(t *testing.T) {
	t.Parallel()
	w := newReplacedWorker(t, statusHandler)
	w.stop(true)
	c := relay.NewClientWith(w.path, relay.ClientOptions{ReconnectWindow: 2 * time.Second})
	defer c.Close()
	start := time.Now()
	_, err := c.Status(context.Background())
	took := time.Since(start)
	require.ErrorIs(t, err, relay.ErrUnavailable)
	require.Contains(t, err.Error(), "for it to come back): dial unix "+w.path+": connect: connection refused")
	require.Greater(t, took, time.Second, "the call waited for the socket")
	require.Less(t, took, 4*time.Second, "the call waited no longer than its window")

	// Its context ends it sooner.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	c2 := relay.NewClientWith(w.path, relay.ClientOptions{ReconnectWindow: time.Minute})
	defer c2.Close()
	start = time.Now()
	_, err = c2.Status(ctx)
	require.ErrorIs(t, err, relay.ErrUnavailable)
	require.Less(t, time.Since(start), 2*time.Second)

	// So does Close.
	done := make(chan error, 1)
	go func() { _, err := c2.Claims(context.Background()); done <- err }()
	time.Sleep(200 * time.Millisecond)
	c2.Close()
	select {
	case err := <-done:
		require.ErrorIs(t, err, relay.ErrUnavailable)
	case <-time.After(3 * time.Second):
		t.Fatal("Close did not end a call waiting for the socket")
	}
}

// cutWorker answers each relay call as a worker would, but the first
// request of each path is cut off mid-flight (the connection closed with
// no reply, as when the worker dies) or answered "session ended".
type cutWorker struct {
	ended bool // answer 503 session_ended instead of cutting

	mu     sync.Mutex
	bodies map[string][]string // path → the bodies received, in order
}

func (cw *cutWorker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	cw.mu.Lock()
	first := len(cw.bodies[r.URL.Path]) == 0
	cw.bodies[r.URL.Path] = append(cw.bodies[r.URL.Path], string(body))
	cw.mu.Unlock()
	switch {
	case first && cw.ended:
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(relay.ErrorResponse{Code: relay.CodeSessionEnded,
			Error: "coordination unavailable: the run's coordination session has ended (the worker is stopping or handing the run back)"})
		return
	case first:
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return
	}
	switch r.URL.Path {
	case relay.PathHello, relay.PathSteerAck:
		w.WriteHeader(http.StatusNoContent)
	default:
		_, _ = io.WriteString(w, "{}")
	}
}

func (cw *cutWorker) sent(path string) []string {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return cw.bodies[path]
}

// A call cut off in flight by the worker's going away (its connection
// closed, or a "session ended" reply) is sent again when the worker does
// nothing twice for it; any other fails with ErrInterrupted, sent once,
// saying it may or may not have taken effect.
func TestCallCutInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	calls := []struct {
		name, path string
		again      bool
		call       func(c *relay.Client) error
	}{
		{"hello", relay.PathHello, true, func(c *relay.Client) error { return c.Hello(ctx) }},
		{"status", relay.PathStatus, true, func(c *relay.Client) error { _, err := c.Status(ctx); return err }},
		{"claims", relay.PathClaims, true, func(c *relay.Client) error { _, err := c.Claims(ctx); return err }},
		{"inbox", relay.PathInbox, true, func(c *relay.Client) error { _, err := c.Inbox(ctx, relay.InboxRequest{Max: 5}); return err }},
		{"claim", relay.PathClaim, true, func(c *relay.Client) error {
			_, err := c.Claim(ctx, relay.ClaimRequest{Paths: []string{"src"}})
			return err
		}},
		{"send with a key", relay.PathSend, true, func(c *relay.Client) error {
			_, err := c.Send(ctx, relay.SendRequest{To: "all", Body: "x", IdempotencyKey: "k1"})
			return err
		}},
		{"notice", relay.PathNotice, true, func(c *relay.Client) error { _, err := c.Notice(ctx, relay.NoticeRequest{After: 2}); return err }},
		{"steer next", relay.PathSteerNext, true, func(c *relay.Client) error { _, err := c.SteerNext(ctx, relay.SteerNextRequest{}); return err }},
		{"steer ack", relay.PathSteerAck, true, func(c *relay.Client) error { return c.SteerAck(ctx, relay.SteerAck{ID: "s1", Delivered: true}) }},
		{"send", relay.PathSend, false, func(c *relay.Client) error {
			_, err := c.Send(ctx, relay.SendRequest{To: "all", Body: "x"})
			return err
		}},
		{"ask", relay.PathAsk, false, func(c *relay.Client) error {
			_, err := c.Ask(ctx, relay.AskRequest{To: "all", Question: "q?", TimeoutSeconds: 5})
			return err
		}},
		{"reply", relay.PathReply, false, func(c *relay.Client) error {
			_, err := c.Reply(ctx, relay.ReplyRequest{QuestionID: "qaaaaaaaaaaaaaaaa", Answer: "a"})
			return err
		}},
		{"release", relay.PathRelease, false, func(c *relay.Client) error {
			_, err := c.Release(ctx, relay.ReleaseRequest{Paths: []string{"src"}})
			return err
		}},
	}
	for _, ended := range []bool{false, true} {
		for _, tt := range calls {
			name := tt.name + "/cut"
			if ended {
				name = tt.name + "/session ended"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				cw := &cutWorker{ended: ended, bodies: map[string][]string{}}
				w := newReplacedWorker(t, cw)
				c := relay.NewClientWith(w.path, relay.ClientOptions{ReconnectWindow: 10 * time.Second})
				defer c.Close()
				err := tt.call(c)
				sent := cw.sent(tt.path)
				if tt.again {
					require.NoError(t, err)
					require.Len(t, sent, 2, "sent again")
					require.Equal(t, sent[0], sent[1], "the same request")
					return
				}
				require.ErrorIs(t, err, relay.ErrInterrupted)
				require.NotErrorIs(t, err, relay.ErrUnavailable)
				require.True(t, strings.HasPrefix(err.Error(), "coordination interrupted: the worker went away while this call was in flight"), err.Error())
				require.Contains(t, err.Error(), "it may or may not have taken effect")
				if tt.path == relay.PathAsk {
					require.Contains(t, err.Error(), "stays open until its timeout, and its answer will be put in your inbox", "an ask is not asked again")
				}
				if ended {
					require.True(t, strings.HasSuffix(err.Error(), "[POST "+tt.path+": the worker's session ended]"), err.Error())
				} else {
					require.Contains(t, err.Error(), "[POST "+tt.path+": ")
				}
				require.Len(t, sent, 1, "not sent again")
			})
		}
	}
}

// An inbox long poll cut off in flight is sent again asking only for what
// is left of its wait.
func TestInboxCutWaitsOnlyWhatIsLeft(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var waits []int
	w := newReplacedWorker(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req relay.InboxRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		waits = append(waits, req.WaitSeconds)
		first := len(waits) == 1
		mu.Unlock()
		if first {
			time.Sleep(2 * time.Second)
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		_ = json.NewEncoder(w).Encode(relay.InboxResponse{Messages: []relay.Message{{ID: "7", Body: "hi"}}})
	}))
	c := relay.NewClientWith(w.path, relay.ClientOptions{ReconnectWindow: 10 * time.Second})
	defer c.Close()
	resp, err := c.Inbox(context.Background(), relay.InboxRequest{WaitSeconds: 10})
	require.NoError(t, err)
	require.Len(t, resp.Messages, 1)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, waits, 2)
	require.Equal(t, 10, waits[0])
	require.InDelta(t, 8, waits[1], 1, "the retry waits what is left of 10 s after 2 s")
}

func TestReconnectWindowFrom(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]time.Duration{"": relay.ReconnectWindow, "0": 0, "90s": 90 * time.Second, "2m": 2 * time.Minute} {
		got, err := relay.ReconnectWindowFrom(func(string) string { return v })
		require.NoError(t, err, v)
		require.Equal(t, want, got, v)
	}
	for _, bad := range []string{"-1s", "soon", "60"} {
		got, err := relay.ReconnectWindowFrom(func(string) string { return bad })
		require.ErrorContains(t, err, relay.EnvReconnectWindow, bad)
		require.Equal(t, relay.ReconnectWindow, got)
	}
}

func TestSocketGone(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := net.Dial("unix", filepath.Join(dir, "none.sock"))
	require.True(t, relay.SocketGone(err), "ENOENT: %v", err)
	path := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())
	_, err = net.Dial("unix", path)
	require.True(t, relay.SocketGone(err), "ECONNREFUSED: %v", err)
	require.False(t, relay.SocketGone(io.EOF))
	require.False(t, relay.SocketGone(&net.OpError{Op: "read", Net: "unix", Err: errors.New("connection reset by peer")}))
}
