package coordination

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetcrew/jetcrew/coordination/relay"
)

// What one run can make the worker hold through its socket. The bridge needs
// a handful of connections (relay.Client keeps at most relay.MaxClientConns
// open); everything past these bounds gets an error, and the worker and every
// other run carry on.
const (
	// MaxConnsPerSession is the most connections one run's socket holds
	// open at once. A connection past it is answered 503
	// "coordination unavailable: too many connections" and closed at once.
	MaxConnsPerSession = 16
	// RequestReadTimeout bounds reading one whole request, headers and body:
	// a client that announces a body and sends it slowly (or never) is
	// disconnected after it.
	RequestReadTimeout = 10 * time.Second
	// responseWriteTimeout bounds handling and answering one request, from
	// the end of its headers: the longest inbox wait plus room for NATS.
	responseWriteTimeout = relay.MaxWaitSeconds*time.Second + 30*time.Second
	// idleTimeout closes a kept-alive connection that carries no request.
	idleTimeout = time.Minute
	// maxHeaderBytes bounds a request's headers.
	maxHeaderBytes = 8 << 10
)

// tooManyConns is the whole reply to a connection past MaxConnsPerSession.
var tooManyConns = func() []byte {
	body := fmt.Sprintf(`{"code":%q,"error":"%s: too many connections to the socket (at most %d at once)"}`,
		relay.CodeUnavailable, relay.ErrUnavailable, MaxConnsPerSession)
	return fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}()

// capListener accepts at most max connections at once; the ones past it are
// answered with tooManyConns and closed, never handed to the server.
type capListener struct {
	net.Listener
	max     int
	open    atomic.Int64
	refused atomic.Int64
}

// Accept returns the next connection within the cap. A connection past the
// cap is refused in place (a short write, then close) and Accept waits for
// the next one.
func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > int64(l.max) {
			l.open.Add(-1)
			l.refused.Add(1)
			_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			_, _ = c.Write(tooManyConns)
			_ = c.Close()
			continue
		}
		return &countedConn{Conn: c, l: l}, nil
	}
}

// countedConn gives its slot back to its listener when closed, once.
type countedConn struct {
	net.Conn
	l    *capListener
	once sync.Once
}

// Close closes the connection and frees its slot.
func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}
