package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/jetcrew/jetcrew/egress/policy"
	"github.com/jetcrew/jetcrew/messages"
)

// The flood helper's environment: the socket to flood and how many
// connections to open.
const (
	floodSocketEnv = "JETCREW_EGRESS_FLOOD_SOCKET"
	floodConnsEnv  = "JETCREW_EGRESS_FLOOD_CONNS"
	// floodWait is how long the helper waits for an answer on each
	// connection before it counts the connection as held.
	floodWait = 3 * time.Second
)

// floodReport is what the flood helper saw, one JSON line on its stdout
// after "FLOOD ".
type floodReport struct {
	Dialed     int    `json:"dialed"`
	DialErrors int    `json:"dial_errors"`
	Refused    int    `json:"refused"` // an answer, then the connection closed
	Held       int    `json:"held"`    // no answer within floodWait
	Other      int    `json:"other"`
	Status     string `json:"status"` // the first refusal's status line
	SlowestMS  int64  `json:"slowest_refusal_ms"`
	FirstError string `json:"first_error,omitempty"`
}

// TestFloodHelper is not a test of its own: TestSocketConnectionsBounded
// runs the test binary again with only it selected and floodSocketEnv set,
// so that the connections it holds are descriptors of another process than
// the one whose descriptors are counted, as a run's are. It opens
// floodConnsEnv connections to the socket, each sending the start of a
// request and never its end, sorts each into refused (an answer, then
// closed) or held (no answer within floodWait), prints a floodReport and
// keeps every connection open until its stdin closes.
func TestFloodHelper(t *testing.T) {
	path := os.Getenv(floodSocketEnv)
	if path == "" {
		t.Skip("run by TestSocketConnectionsBounded in another process")
	}
	n, err := strconv.Atoi(os.Getenv(floodConnsEnv))
	require.NoError(t, err)
	var (
		mu  sync.Mutex
		rep floodReport
		wg  sync.WaitGroup
		all []net.Conn
	)
	for range n {
		start := time.Now()
		c, err := net.Dial("unix", path)
		if err != nil {
			rep.DialErrors++
			if rep.FirstError == "" {
				rep.FirstError = err.Error()
			}
			continue
		}
		rep.Dialed++
		all = append(all, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(start.Add(floodWait))
			_, werr := io.WriteString(c, "GET http://api.test/ HTTP/1.1\r\nHost: api.test\r\n")
			got, rerr := io.ReadAll(c)
			var ne net.Error
			mu.Lock()
			defer mu.Unlock()
			switch {
			case len(got) == 0 && errors.As(rerr, &ne) && ne.Timeout():
				rep.Held++
			// The answer, then the close: a reset, as the proxy closes
			// with the unread request in its buffer; the answer is read
			// whole before it.
			case (rerr == nil || errors.Is(rerr, syscall.ECONNRESET)) && bytes.HasPrefix(got, []byte("HTTP/1.1 ")):
				rep.Refused++
				if rep.Status == "" {
					rep.Status, _, _ = strings.Cut(string(got), "\r\n")
				}
				rep.SlowestMS = max(rep.SlowestMS, time.Since(start).Milliseconds())
			default:
				rep.Other++
				if rep.FirstError == "" {
					rep.FirstError = fmt.Sprintf("write %v, read %q, %v", werr, got, rerr)
				}
			}
		}()
	}
	wg.Wait()
	line, err := json.Marshal(rep)
	require.NoError(t, err)
	fmt.Printf("FLOOD %s\n", line)
	_, _ = io.Copy(io.Discard, os.Stdin) // hold everything until told
	for _, c := range all {
		_ = c.Close()
	}
}

// lockedBuffer is a bytes.Buffer a process writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// openFDs counts the descriptors this process has open.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// TestSocketConnectionsBounded holds on the egress
// socket: a run that opens far more connections than its cap (1000 against
// DefaultMaxConns, from another process, as the run's processes are) gets
// every connection past the cap answered 429 and closed at once, each one a
// refused attempt; the worker's descriptors grow by the cap at most, not by
// the run's connections; and another run's session serves plain HTTP and
// CONNECT meanwhile. Once the flood ends, the run is served again.
//
// Not parallel: it counts the process's descriptors, which the package's
// other tests (paused meanwhile) would change.
func TestSocketConnectionsBounded(t *testing.T) {
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		t.Skip("needs /proc/self/fd to count descriptors")
	}
	const floodConns = 1000
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "plain") }))
	defer plain.Close()
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "tls") }))
	defer tlsSrv.Close()
	pp, tp := port(t, plain.URL), port(t, tlsSrv.URL)
	res := table{"api.test": {netip.MustParseAddr("127.0.0.1")}}
	entries := []string{"api.test:" + pp, "127.0.0.1:" + pp, "api.test:" + tp, "127.0.0.1:" + tp}
	none := openFDs(t)
	attacked, innocent := setup(t, res, entries...), setup(t, res, entries...)
	served := func(b *bundle) error {
		c := b.client()
		for _, u := range []string{"http://api.test:" + pp + "/", "https://api.test:" + tp + "/"} {
			resp, err := c.Get(u)
			if err != nil {
				return err
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s: %s", u, resp.Status, body)
			}
		}
		return nil
	}
	require.NoError(t, served(attacked))
	require.NoError(t, served(innocent))
	base := openFDs(t)

	cmd := exec.Command(os.Args[0], "-test.run=^TestFloodHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), floodSocketEnv+"="+attacked.path, floodConnsEnv+"="+strconv.Itoa(floodConns))
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "FLOOD "); ok {
				lines <- rest
			}
		}
		close(lines)
	}()
	var rep floodReport
	select {
	case line, ok := <-lines:
		require.True(t, ok, "the flood helper ended without a report: %s", stderr.String())
		require.NoError(t, json.Unmarshal([]byte(line), &rep))
	case <-time.After(2 * time.Minute):
		t.Fatalf("no report from the flood helper: %s", stderr.String())
	}
	during := openFDs(t)
	t.Logf("flood of %d connections: %+v; the worker's descriptors: %d before, %d during", floodConns, rep, base, during)

	// The innocent run is served while the flood holds its connections.
	require.NoError(t, served(innocent))
	// The flooded run: at most its cap held, the rest answered and closed.
	require.Zero(t, rep.DialErrors, rep.FirstError)
	require.Zero(t, rep.Other, rep.FirstError)
	require.LessOrEqual(t, rep.Held, DefaultMaxConns, "connections the worker holds for one run")
	require.GreaterOrEqual(t, rep.Refused, floodConns-DefaultMaxConns)
	require.Equal(t, "HTTP/1.1 429 Too Many Requests", rep.Status)
	require.Less(t, rep.SlowestMS, floodWait.Milliseconds(), "a refusal is answered at once")
	require.LessOrEqual(t, during-base, DefaultMaxConns+16, "the worker's descriptors grow by the run's cap at most")
	tot := attacked.sess.Totals()
	require.GreaterOrEqual(t, tot.Refused, int64(rep.Refused), "each refused connection is a refused attempt")
	var capEvents int
	for _, ev := range attacked.recorded() {
		if !ev.Allowed && strings.Contains(ev.Reason, "too many connections") {
			capEvents++
		}
	}
	require.Positive(t, capEvents)

	// The flood ends: the run's slots are free again.
	require.NoError(t, stdin.Close())
	require.NoError(t, cmd.Wait())
	require.Eventually(t, func() bool { return served(attacked) == nil }, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return openFDs(t)-base <= 16 }, 10*time.Second, 20*time.Millisecond,
		"descriptors after the flood: %d, before: %d", openFDs(t), base)

	// The runs end: their sessions leave no descriptor behind, not even an
	// idle connection to a host, which a kept-alive request leaves.
	for _, b := range []*bundle{attacked, innocent} {
		c, err := net.Dial("unix", b.path)
		require.NoError(t, err)
		_, err = fmt.Fprintf(c, "GET http://api.test:%s/ HTTP/1.1\r\nHost: api.test:%s\r\n\r\n", pp, pp)
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.NoError(t, c.Close())
	}
	attacked.sess.Close()
	innocent.sess.Close()
	require.Eventually(t, func() bool { return openFDs(t) <= none }, 5*time.Second, 20*time.Millisecond,
		"descriptors after both sessions closed: %d, without them: %d", openFDs(t), none)
}

// deadlineBundle is a session with short bounds: 1 s to read a request,
// 1 s without a byte either way.
func deadlineBundle(t *testing.T, entries ...string) *bundle {
	t.Helper()
	b := &bundle{path: t.TempDir() + "/egress.sock"}
	cfg := Config{Resolver: table{"api.test": {netip.MustParseAddr("127.0.0.1")}},
		RequestReadTimeout: time.Second, IdleTimeout: time.Second,
		Publish: func(ev messages.EgressEvent) { b.mu.Lock(); b.events = append(b.events, ev); b.mu.Unlock() }}
	s, err := Open(cfg, "run1", policy.Must(entries...), b.path)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	b.sess = s
	return b
}

// closedWithin reads c until the proxy closes it and fails unless that
// happens within limit.
func closedWithin(t *testing.T, c net.Conn, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	require.NoError(t, c.SetReadDeadline(start.Add(limit+5*time.Second)))
	_, err := io.Copy(io.Discard, c)
	took := time.Since(start)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection is still open after %s", took)
	require.Less(t, took, limit, "closed too late")
	return took
}

// eventually waits until the session recorded an event for which ok holds.
func (b *bundle) eventually(t *testing.T, ok func(messages.EgressEvent) bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, ev := range b.recorded() {
			if ok(ev) {
				return true
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond, "%+v", b.recorded())
}

// TestSocketDeadlines proves the egress socket's time bounds: in
// whatever state a run leaves a connection to its proxy, it is closed in
// bounded time, and an attempt it carried is recorded. Config bounds here:
// 1 s to read a whole request, 1 s without a byte either way; each
// connection must be closed within 6 s (net/http lingers 0.5 s before it
// closes after an error answer; a loaded machine adds more). Before the
// bounds, none was closed within the 9 s the test then waited.
func TestSocketDeadlines(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			chunk := bytes.Repeat([]byte("x"), 64<<10)
			for range 128 { // 8 MiB: more than the socket buffers
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		case "/never":
			select {
			case <-r.Context().Done():
			case <-release:
			}
		default:
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = io.WriteString(w, "ok")
		}
	}))
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	// Cleanups, not defers: the parallel subtests run after this function
	// returns. The handlers still waiting are released first.
	t.Cleanup(tlsSrv.Close)
	t.Cleanup(plain.Close)
	t.Cleanup(func() { close(release) })
	pp, tp := port(t, plain.URL), port(t, tlsSrv.URL)
	entries := []string{"api.test:" + pp, "127.0.0.1:" + pp, "api.test:" + tp, "127.0.0.1:" + tp}
	dial := func(t *testing.T, b *bundle) net.Conn {
		c, err := net.Dial("unix", b.path)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	// trickle writes one byte of s every 100 ms (each resets the idle
	// bound) until the proxy closes c.
	trickle := func(c net.Conn, s string) {
		go func() {
			for i := 0; ; i++ {
				if _, err := io.WriteString(c, s[i%len(s):i%len(s)+1]); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}

	t.Run("headers sent slowly", func(t *testing.T) {
		t.Parallel()
		b := deadlineBundle(t, entries...)
		c := dial(t, b)
		trickle(c, "GET http://api.test:"+pp+"/ HTTP/1.1\r\nX-Slow: "+strings.Repeat("a", 1000))
		closedWithin(t, c, 6*time.Second)
	})
	t.Run("body sent slowly", func(t *testing.T) {
		t.Parallel()
		b := deadlineBundle(t, entries...)
		c := dial(t, b)
		_, err := fmt.Fprintf(c, "POST http://api.test:%s/ HTTP/1.1\r\nHost: api.test:%s\r\nContent-Length: 100000\r\n\r\n", pp, pp)
		require.NoError(t, err)
		trickle(c, "x")
		closedWithin(t, c, 6*time.Second)
		b.eventually(t, func(ev messages.EgressEvent) bool { return ev.Method == http.MethodPost && ev.Reason != "" })
	})
	t.Run("idle tunnel", func(t *testing.T) {
		t.Parallel()
		b := deadlineBundle(t, entries...)
		c := dial(t, b)
		_, err := fmt.Fprintf(c, "CONNECT api.test:%s HTTP/1.1\r\nHost: api.test:%s\r\n\r\n", tp, tp)
		require.NoError(t, err)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		tc := tls.Client(&readerConn{Conn: c, r: br}, &tls.Config{ServerName: "api.test", InsecureSkipVerify: true})
		require.NoError(t, tc.Handshake())
		// Then nothing either way.
		closedWithin(t, tc, 6*time.Second)
		b.eventually(t, func(ev messages.EgressEvent) bool {
			return ev.Method == http.MethodConnect && ev.Allowed && ev.BytesDown > 0
		})
	})
	t.Run("waiting for the host", func(t *testing.T) {
		t.Parallel()
		b := deadlineBundle(t, entries...)
		c := dial(t, b)
		_, err := fmt.Fprintf(c, "GET http://api.test:%s/never HTTP/1.1\r\nHost: api.test:%s\r\n\r\n", pp, pp)
		require.NoError(t, err)
		closedWithin(t, c, 6*time.Second)
		b.eventually(t, func(ev messages.EgressEvent) bool { return ev.Allowed && strings.Contains(ev.Reason, "upstream") })
	})
	t.Run("answer never read", func(t *testing.T) {
		t.Parallel()
		b := deadlineBundle(t, entries...)
		c := dial(t, b)
		_, err := fmt.Fprintf(c, "GET http://api.test:%s/big HTTP/1.1\r\nHost: api.test:%s\r\n\r\n", pp, pp)
		require.NoError(t, err)
		// The run reads nothing; the proxy's writes fill the socket and
		// stop: the connection is idle.
		b.eventually(t, func(ev messages.EgressEvent) bool {
			return ev.Allowed && ev.Method == http.MethodGet && ev.BytesDown > 0 && ev.BytesDown < 8<<20
		})
	})
	t.Run("kept alive, idle", func(t *testing.T) {
		t.Parallel()
		b := deadlineBundle(t, entries...)
		c := dial(t, b)
		_, err := fmt.Fprintf(c, "GET http://api.test:%s/ HTTP/1.1\r\nHost: api.test:%s\r\n\r\n", pp, pp)
		require.NoError(t, err)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		closedWithin(t, &readerConn{Conn: c, r: br}, 6*time.Second)
	})
}

// readerConn is c whose reads come from r (a bufio.Reader over c that may
// hold bytes already read).
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c *readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// unanswered returns the port of a loopback listener whose accept queue is
// full (backlog 0, one connection waiting): a connection to it hangs in
// connect, as to a host that drops SYNs.
func unanswered(t *testing.T) string {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Close(fd) })
	require.NoError(t, unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, unix.Listen(fd, 0))
	sa, err := unix.Getsockname(fd)
	require.NoError(t, err)
	p := strconv.Itoa(sa.(*unix.SockaddrInet4).Port)
	for range 4 { // fill the queue; the later ones hang and time out
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+p, 200*time.Millisecond); err == nil {
			t.Cleanup(func() { _ = c.Close() })
		}
	}
	_, err = net.DialTimeout("tcp", "127.0.0.1:"+p, 200*time.Millisecond)
	require.Error(t, err, "the listener's queue is not full")
	return p
}

// TestSocketTunnelDialEndsWithTunnel: the upstream connection a tunnel
// dials while its ClientHello comes is abandoned with the tunnel, so a run
// that opens and drops tunnels to a host that does not answer holds no
// descriptor of the worker past its connections (before, each dial lived on
// for DialTimeout, 10 s, however fast the run churned).
//
// Not parallel: it counts the process's descriptors.
func TestSocketTunnelDialEndsWithTunnel(t *testing.T) {
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		t.Skip("needs /proc/self/fd to count descriptors")
	}
	p := unanswered(t)
	b := setup(t, table{}, "127.0.0.1:"+p)
	base := openFDs(t)
	const tunnels = 50
	for range tunnels {
		c, err := net.Dial("unix", b.path)
		require.NoError(t, err)
		_, err = fmt.Fprintf(c, "CONNECT 127.0.0.1:%s HTTP/1.1\r\nHost: 127.0.0.1:%s\r\n\r\n", p, p)
		require.NoError(t, err)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		_, err = io.WriteString(c, "not a TLS ClientHello\r\n\r\n")
		require.NoError(t, err)
		closedWithin(t, &readerConn{Conn: c, r: br}, 6*time.Second)
		require.NoError(t, c.Close())
	}
	require.Eventually(t, func() bool { return openFDs(t)-base <= 4 }, 2*time.Second, 20*time.Millisecond,
		"descriptors after %d dropped tunnels: %d, before: %d", tunnels, openFDs(t), base)
	require.Eventually(t, func() bool { return b.sess.Totals().Refused == tunnels }, 5*time.Second, 10*time.Millisecond)
}
