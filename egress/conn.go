package egress

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// connListener hands the session's server each accepted connection as a
// clientConn.
type connListener struct {
	net.Listener
	conns *connSet
}

// Accept returns the next connection of the run, as a *clientConn.
func (l connListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.conns.accept(c), nil
}

// connSet holds a session's open connections, the run's (clientConn) and
// the tunnels' upstream ends, so that Kill can cut them all.
type connSet struct {
	idle time.Duration // Config.IdleTimeout
	log  zerolog.Logger
	mu   sync.Mutex
	set  map[net.Conn]struct{}
}

// newConnSet returns an empty set whose run connections close after idle
// without a byte.
func newConnSet(idle time.Duration, log zerolog.Logger) *connSet {
	return &connSet{idle: idle, log: log, set: make(map[net.Conn]struct{})}
}

// track adds c to the set (on) or removes it.
func (cs *connSet) track(c net.Conn, on bool) {
	cs.mu.Lock()
	if on {
		cs.set[c] = struct{}{}
	} else {
		delete(cs.set, c)
	}
	cs.mu.Unlock()
}

// closeAll closes every connection in the set.
func (cs *connSet) closeAll() {
	cs.mu.Lock()
	conns := make([]net.Conn, 0, len(cs.set))
	for c := range cs.set {
		conns = append(conns, c)
	}
	cs.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// epoch is the origin of clientConn.last: a monotonic clock reading.
var epoch = time.Now()

// clientConn is one connection of the run to its session's socket, from
// accept to close, whatever serves it (the HTTP server, a tunnel, a
// terminated tunnel). It is closed once it has moved no byte either way for
// Config.IdleTimeout; its context ends when it is closed; Kill closes it.
type clientConn struct {
	net.Conn
	conns  *connSet
	ctx    context.Context
	cancel context.CancelCauseFunc // errIdle when the idle bound closed it
	idle   time.Duration
	last   atomic.Int64 // when a byte last moved, as time.Since(epoch)
	timer  *time.Timer  // runs checkIdle
	closed atomic.Bool
	once   sync.Once
}

// connKey is the context key of a request's *clientConn
// (http.Server.ConnContext).
type connKey struct{}

// accept makes c, a connection of the run just accepted, a clientConn in
// the set.
func (cs *connSet) accept(c net.Conn) *clientConn {
	cc := &clientConn{Conn: c, conns: cs, idle: cs.idle}
	cc.ctx, cc.cancel = context.WithCancelCause(context.Background())
	cc.touch()
	cc.timer = time.AfterFunc(cc.idle, cc.checkIdle)
	cs.track(cc, true)
	return cc
}

// connContext is the session's http.Server.ConnContext: it makes a
// request's connection known to the handlers (connCtx).
func connContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// connCtx returns the context of the connection req came on: it ends when
// the connection is closed (by the run, the idle bound, Kill or Close;
// its cause is errIdle for the idle bound). A
// request's own context is not the one to decide or send it in: Go's server
// cancels it when the run half-closes the connection after its request
// (golang/go#18527), which the launcher's relay does when the run's side
// ends its sending, although the run still reads the answer. For a request
// not from the socket (none in the proxy) it is req's context without its
// cancellation.
func connCtx(req *http.Request) context.Context {
	if c, ok := req.Context().Value(connKey{}).(*clientConn); ok {
		return c.ctx
	}
	return context.WithoutCancel(req.Context())
}

// touch notes that a byte moved.
func (c *clientConn) touch() { c.last.Store(int64(time.Since(epoch))) }

// checkIdle closes the connection when no byte moved for the idle bound,
// else looks again when the bound would be reached.
func (c *clientConn) checkIdle() {
	if c.closed.Load() {
		return
	}
	quiet := time.Since(epoch) - time.Duration(c.last.Load())
	if quiet < c.idle {
		c.timer.Reset(c.idle - quiet)
		return
	}
	c.conns.log.Debug().Dur("idle", quiet).Msg("egress connection idle: closed")
	c.cancel(errIdle)
	_ = c.Close()
}

// Read reads from the run, noting activity.
func (c *clientConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.touch()
	}
	return n, err
}

// Write writes to the run, noting activity.
func (c *clientConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.touch()
	}
	return n, err
}

// CloseWrite half-closes the connection when the underlying one can; a
// tunnel forwards the host's end of sending that way.
func (c *clientConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// Close closes the connection (freeing its place under Config.MaxConns),
// ends its context and forgets it, once.
func (c *clientConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.closed.Store(true)
		c.timer.Stop()
		c.cancel(context.Canceled)
		c.conns.track(c, false)
	})
	return err
}
