package coordination_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
)

// holdConn dials path and sends a request announcing a 100000-byte body with
// one byte of it, then holds the connection: a run trying to pin the
// worker's connections with bodies it never finishes.
func holdConn(t *testing.T, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = io.WriteString(c, "POST /v1/send HTTP/1.1\r\nHost: jetcrew\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
	require.NoError(t, err)
	return c
}

// TestSocketBoundsPerSession proves what a run can make the worker hold
// through its socket, whatever the agent does: at most MaxConnsPerSession
// connections (the next is answered 503 and closed), each request read
// within the read timeout (a body announced and never sent is cut off), and
// a body no larger than relay.MaxRequestBytes. Another run's socket and the
// same run's later calls carry on.
func TestSocketBoundsPerSession(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{RequestReadTimeout: time.Second})
	b.serve(t, h, "a", "g")
	_, other := b.serve(t, h, "b", "g")
	path := coordtest.SocketPath(b.dir, "a")

	held := make([]net.Conn, coordination.MaxConnsPerSession)
	for i := range held {
		held[i] = holdConn(t, path)
	}
	// One more: refused at once with a reply the bridge reads as
	// "coordination unavailable".
	extra, err := net.Dial("unix", path)
	require.NoError(t, err)
	defer extra.Close()
	require.NoError(t, extra.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(extra), nil)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Contains(t, string(body), "too many connections")
	_, err = relay.NewClient(path).Status(context.Background())
	require.ErrorIs(t, err, relay.ErrUnavailable)

	// Another run is not affected meanwhile.
	require.Equal(t, "b", status(t, other).RunID)

	// The held connections are cut off by the whole-request read deadline.
	start := time.Now()
	for _, c := range held {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, err := io.ReadAll(c) // whatever the server says, it then closes
		require.False(t, errors.Is(err, context.DeadlineExceeded), "connection still held")
		var ne net.Error
		require.False(t, errors.As(err, &ne) && ne.Timeout(), "connection still held after %s", time.Since(start))
	}
	t.Logf("held connections closed %s after the test started waiting", time.Since(start))

	// The run's slots are free again.
	cl := relay.NewClient(path)
	defer cl.Close()
	st, err := cl.Status(context.Background())
	require.NoError(t, err)
	require.Equal(t, "a", st.RunID)

	// A body past relay.MaxRequestBytes is refused, whatever length is
	// announced.
	big := strings.NewReader(`{"to":"all","body":"` + strings.Repeat("x", relay.MaxRequestBytes) + `"}`)
	res, err := socketHTTP(path).Post("http://jetcrew"+relay.PathSend, "application/json", big)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, res.StatusCode)
}

// TestRateLimitedCallsCounted proves the per-run token buckets on bridge
// calls, which keep one run from flooding its group or the worker: sends,
// refused ones included, and reads each have
// a burst then a rate; a call past it gets a clear "rate limited" tool
// error; and refusals for rate are counted in a few events, not stored one
// by one.
func TestRateLimitedCallsCounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{SendRate: 0.001, SendBurst: 2, ReadRate: 0.001, ReadBurst: 3})
	sess, a := b.serve(t, h, "a", "g")
	cl := relay.NewClient(coordtest.SocketPath(b.dir, "a"))
	defer cl.Close()

	const sends = 200
	var limited int
	for range sends {
		_, err := cl.Send(context.Background(), relay.SendRequest{To: "nobody", Body: "x"})
		var re *relay.Error
		require.ErrorAs(t, err, &re)
		if re.Code == relay.CodeRateLimited {
			require.Equal(t, http.StatusTooManyRequests, re.Status)
			require.Contains(t, re.Message, "rate limited: a run may make send calls at 0.001 per second")
			limited++
		} else {
			require.Equal(t, relay.CodeUnknownPeer, re.Code)
		}
	}
	require.Equal(t, sends-2, limited)
	// Reads: three, then limited, through the bridge as a tool error.
	for range 3 {
		status(t, a)
	}
	require.Contains(t, toolError(t, a, "status", map[string]any{}), "rate limited: a run may make status, inbox and claims calls")
	require.Contains(t, toolError(t, a, "inbox", map[string]any{}), "rate limited")
	require.EqualValues(t, sends-2+2, sess.RateLimited())

	require.NoError(t, sess.Close(context.Background()))
	refused := b.eventsOf("a", coordination.EventRefused)
	var counted int
	for _, ev := range refused {
		counted += ev.Count
	}
	require.Equal(t, sends-2+2, counted, "every rate-limited call is counted")
	require.LessOrEqual(t, len(refused), 2+2, "2 unknown-peer refusals, then rate limiting in at most two events: %+v", refused)
}
