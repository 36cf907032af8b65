package connlimit_test

import (
	"io"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/internal/connlimit"
)

type bundle struct {
	path     string
	lim      *connlimit.Limit
	accepted chan net.Conn
	onRefuse atomic.Int64
	l        net.Listener // the socket's current listener
}

// setup serves a unix socket under a Limit of max and hands the accepted
// connections to the test.
func setup(t *testing.T, max int) *bundle {
	t.Helper()
	b := &bundle{path: filepath.Join(t.TempDir(), "s.sock"), accepted: make(chan net.Conn, 100)}
	b.lim = connlimit.New(max, []byte("full\n"), func() { b.onRefuse.Add(1) })
	b.listen(t)
	return b
}

// listen opens the socket (again) under the same Limit.
func (b *bundle) listen(t *testing.T) {
	t.Helper()
	raw, err := net.Listen("unix", b.path)
	require.NoError(t, err)
	l := b.lim.Listener(raw)
	b.l = l
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b.accepted <- c
		}
	}()
}

func (b *bundle) dial(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", b.path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// refusedNow fails unless c is answered with the reply and closed.
func refusedNow(t *testing.T, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	require.Equal(t, "full\n", string(got))
}

// TestLimit: at most max connections reach the server; one past it is
// answered and closed at once and counted; closing a connection (twice)
// frees one place; a half-close frees none; a listener opened again under
// the same Limit shares the count.
func TestLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.dial(t)
	b.dial(t)
	first, second := <-b.accepted, <-b.accepted
	require.Equal(t, 2, b.lim.Open())

	refusedNow(t, b.dial(t))
	require.EqualValues(t, 1, b.lim.Refused())
	require.EqualValues(t, 1, b.onRefuse.Load())
	require.Empty(t, b.accepted)

	require.NoError(t, first.(interface{ CloseWrite() error }).CloseWrite())
	require.Equal(t, 2, b.lim.Open(), "a half-close keeps the place")
	require.NoError(t, first.Close())
	_ = first.Close()
	require.Equal(t, 1, b.lim.Open(), "freed once")
	b.dial(t)
	third := <-b.accepted
	refusedNow(t, b.dial(t))

	// The listener fails and is opened again: the open ones still count.
	require.NoError(t, b.l.Close())
	b.listen(t)
	refusedNow(t, b.dial(t))
	require.NoError(t, second.Close())
	b.dial(t)
	<-b.accepted
	require.Equal(t, 2, b.lim.Open())
	require.NoError(t, third.Close())
	require.EqualValues(t, 3, b.lim.Refused())
}

// TestNewRefusesNoPlace: a limit below one connection is a programming
// error.
func TestNewRefusesNoPlace(t *testing.T) {
	t.Parallel()
	require.Panics(t, func() { connlimit.New(0, nil, nil) })
}
