package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// halfClosed sends raw on a new connection to the session's socket, then
// half-closes it (as the launcher's relay does when the run's side ends its
// sending, e.g. nc after printf) and reads the one response.
func (b *bundle) halfClosed(t *testing.T, raw string) (int, string) {
	t.Helper()
	c, err := net.Dial("unix", b.path)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(c, raw)
	require.NoError(t, err)
	require.NoError(t, c.(*net.UnixConn).CloseWrite())
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// TestProxyPlainHTTPHalfClosed holds for every kind of
// plain-HTTP request: a run whose connection to its proxy is half-closed
// once the request is sent (the relay does that) still gets the host's
// answer, by listed address and by listed name, GET and POST with a body,
// HTTP/1.0 and 1.1; refused requests get 403; and every attempt, whatever
// its outcome, is one event, a request that is no proxy request included.
func TestProxyPlainHTTPHalfClosed(t *testing.T) {
	t.Parallel()
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "%s %d", r.Method, n)
	}))
	defer plain.Close()
	pp := port(t, plain.URL)
	b := setup(t, table{"api.test": {netip.MustParseAddr("127.0.0.1")}, "unlisted.test": {netip.MustParseAddr("127.0.0.1")}},
		"127.0.0.1:"+pp, "api.test:"+pp)

	const rounds = 10
	allowed, refused := 0, 0
	for range rounds {
		for _, host := range []string{"127.0.0.1", "api.test"} {
			u := "http://" + net.JoinHostPort(host, pp) + "/"
			code, body := b.halfClosed(t, "GET "+u+" HTTP/1.0\r\n\r\n")
			require.Equal(t, http.StatusOK, code, "GET %s: %s", u, body)
			require.Equal(t, "GET 0", body)
			payload := strings.Repeat("x", 1000)
			code, body = b.halfClosed(t, "POST "+u+" HTTP/1.1\r\nHost: "+net.JoinHostPort(host, pp)+"\r\nContent-Length: "+strconv.Itoa(len(payload))+"\r\n\r\n"+payload)
			require.Equal(t, http.StatusOK, code, "POST %s: %s", u, body)
			require.Equal(t, "POST 1000", body)
			allowed += 2
		}
		for _, u := range []string{"http://unlisted.test:" + pp + "/", "http://169.254.169.254/latest/meta-data/"} {
			code, body := b.halfClosed(t, "GET "+u+" HTTP/1.0\r\n\r\n")
			require.Equal(t, http.StatusForbidden, code, "GET %s: %s", u, body)
			refused++
		}
		code, _ := b.halfClosed(t, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
		require.Equal(t, http.StatusBadRequest, code, "a request that is no proxy request")
		refused++
	}
	require.Eventually(t, func() bool { return len(b.recorded()) == allowed+refused }, 5*time.Second, 10*time.Millisecond,
		"one event per attempt: want %d, have %d", allowed+refused, len(b.recorded()))
	for _, ev := range b.recorded() {
		if ev.Allowed {
			require.Empty(t, ev.Reason, "%+v", ev)
			require.Positive(t, ev.BytesDown, "%+v", ev)
		} else {
			require.NotEmpty(t, ev.Reason, "%+v", ev)
		}
	}
	tot := b.sess.Totals()
	require.EqualValues(t, allowed, tot.Allowed)
	require.EqualValues(t, refused, tot.Refused)
}

// TestProxyPlainHTTPUpgradeRefused: a plain-HTTP protocol upgrade
// (WebSocket's "Upgrade: websocket") is refused with 403 and an event, and
// never reaches the host: goproxy's relay of an upgraded connection would
// leave the run's connection open after it ends, and the attempt unrecorded.
// WebSocket over TLS (wss://) goes through CONNECT like any TLS.
func TestProxyPlainHTTPUpgradeRefused(t *testing.T) {
	t.Parallel()
	reached := make(chan struct{}, 10)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached <- struct{}{}
		c, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = rw.Flush()
		_, _ = io.Copy(c, rw) // echo until the proxy closes
	}))
	defer up.Close()
	pp := port(t, up.URL)
	b := setup(t, table{"api.test": {netip.MustParseAddr("127.0.0.1")}}, "api.test:"+pp, "127.0.0.1:"+pp)
	c, err := net.Dial("unix", b.path)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = fmt.Fprintf(c, "GET http://api.test:%s/chat HTTP/1.1\r\nHost: api.test:%s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", pp, pp)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Eventually(t, func() bool {
		ev := b.recorded()
		return len(ev) == 1 && !ev[0].Allowed && strings.Contains(ev[0].Reason, "upgrade")
	}, 5*time.Second, 10*time.Millisecond, "%+v", b.recorded())
	require.Empty(t, reached, "the host was not reached")
	start := time.Now()
	b.sess.Close()
	require.Less(t, time.Since(start), closeWait-time.Second, "an attempt was left open")
}
