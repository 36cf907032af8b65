package egress

import (
	"context"
	"net"
	"net/http"
	"sync"
)

// connListener hands the session's server each accepted connection as a
// clientConn.
type connListener struct {
	net.Listener
	s *Session
}

// Accept returns the next connection of the run, as a *clientConn.
func (l connListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.s.newClientConn(c), nil
}

// clientConn is one connection of the run to its session's socket, from
// accept to close, whatever serves it (the HTTP server, a tunnel, a
// terminated tunnel). Its context ends when it is closed; Kill closes it.
type clientConn struct {
	net.Conn
	s      *Session
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once
}

// connKey is the context key of a request's *clientConn
// (http.Server.ConnContext).
type connKey struct{}

func (s *Session) newClientConn(c net.Conn) *clientConn {
	cc := &clientConn{Conn: c, s: s}
	cc.ctx, cc.cancel = context.WithCancel(context.Background())
	s.track(cc, true)
	return cc
}

// connContext is the session's http.Server.ConnContext: it makes a
// request's connection known to the handlers (connOf).
func connContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// connCtx returns the context of the connection req came on: it ends when
// the connection is closed (by the run, Kill or Close). A request's own
// context is not the one to decide or send it in: Go's server cancels it
// when the run half-closes the connection after its request
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

// CloseWrite half-closes the connection when the underlying one can; a
// tunnel forwards the host's end of sending that way.
func (c *clientConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// Close closes the connection, ends its context and forgets it, once.
func (c *clientConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.cancel()
		c.s.track(c, false)
	})
	return err
}
