package coordination_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

// A socket kept bound by CloseKeepSocket is served again by a session of
// another run after its directory moved, and a connection left waiting in
// its backlog in between (as a process of the earlier run's container could
// leave one) is closed unread: the later session never sees its request.
func TestKeptSocketServedAgainWithoutStaleConnections(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	dirA := filepath.Join(b.dir, "a")
	require.NoError(t, os.Mkdir(dirA, 0o755))
	sa, err := h.Serve(context.Background(), coordination.RunInfo{RunID: "a", Group: "a"}, filepath.Join(dirA, messages.SocketName))
	require.NoError(t, err)
	resp, err := socketHTTP(filepath.Join(dirA, messages.SocketName)).Post("http://run"+relay.PathHello, "", nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	require.NoError(t, resp.Body.Close())
	require.True(t, sa.Connected())

	sock, err := sa.CloseKeepSocket(context.Background())
	require.NoError(t, err)
	require.NotNil(t, sock)
	kept, err := os.Lstat(filepath.Join(dirA, messages.SocketName))
	require.NoError(t, err, "the socket file stays")
	require.Equal(t, os.ModeSocket|coordination.SocketMode, kept.Mode())

	// Connections to the parked socket wait in its backlog, one with a
	// whole request in it.
	var stale []net.Conn
	for range 3 {
		c, err := net.Dial("unix", filepath.Join(dirA, messages.SocketName))
		require.NoError(t, err, "the socket is still bound")
		t.Cleanup(func() { _ = c.Close() })
		stale = append(stale, c)
	}
	_, err = io.WriteString(stale[0], "POST "+relay.PathHello+" HTTP/1.1\r\nHost: run\r\nContent-Length: 0\r\n\r\n")
	require.NoError(t, err)

	dirB := filepath.Join(b.dir, "b")
	require.NoError(t, os.Rename(dirA, dirB))
	pathB := filepath.Join(dirB, messages.SocketName)
	sb, err := h.ServeSocket(context.Background(), coordination.RunInfo{RunID: "b", Group: "b"}, pathB, sock)
	require.NoError(t, err)
	for _, c := range stale {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		n, err := c.Read(make([]byte, 64))
		require.Zero(t, n, "a waiting connection gets no answer")
		// Closed: EOF, or a reset for the one whose request was unread.
		require.True(t, errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET), "a waiting connection is closed: %v", err)
	}
	require.False(t, sb.Connected(), "run b's session never saw the stale request")
	require.Empty(t, b.eventsOf("b", coordination.EventConnected))

	// Run b's own connections are served.
	require.Equal(t, "b", statusOver(t, pathB).RunID)
	require.True(t, sb.Connected())
	fi, err := os.Lstat(pathB)
	require.NoError(t, err)
	require.True(t, os.SameFile(kept, fi), "the same socket, not a new bind")
	require.NoError(t, sb.Close(context.Background()))
	_, err = os.Lstat(pathB)
	require.ErrorIs(t, err, os.ErrNotExist, "Close removes the socket")
	_, err = net.Dial("unix", pathB)
	require.Error(t, err)
}

// A session detached before CloseKeepSocket keeps nothing (its socket was
// closed and removed then); a kept socket whose file is not at the path
// given is refused and closed.
func TestKeptSocketRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	path := filepath.Join(b.dir, "d.sock")
	s, err := h.Serve(context.Background(), coordination.RunInfo{RunID: "d", Group: "d"}, path)
	require.NoError(t, err)
	require.NoError(t, s.Detach(context.Background()))
	sock, err := s.CloseKeepSocket(context.Background())
	require.NoError(t, err)
	require.Nil(t, sock)
	_, err = os.Lstat(path)
	require.ErrorIs(t, err, os.ErrNotExist)

	s, err = h.Serve(context.Background(), coordination.RunInfo{RunID: "e", Group: "e"}, path)
	require.NoError(t, err)
	sock, err = s.CloseKeepSocket(context.Background())
	require.NoError(t, err)
	require.NotNil(t, sock)
	require.NoError(t, os.Rename(path, path+"2"))
	other := filepath.Join(b.dir, "other.sock")
	l, err := net.Listen("unix", other)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	_, err = h.ServeSocket(context.Background(), coordination.RunInfo{RunID: "f", Group: "f"}, other, sock)
	require.ErrorContains(t, err, "not the socket kept bound")
	_, err = net.Dial("unix", path+"2")
	require.Error(t, err, "the refused socket is closed")
}

// statusOver calls the status endpoint of the socket at path.
func statusOver(t *testing.T, path string) relay.Status {
	t.Helper()
	st, err := relay.NewClient(path).Status(context.Background())
	require.NoError(t, err)
	return st
}
