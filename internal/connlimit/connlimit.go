// Package connlimit bounds how many connections a server holds open at once
// on the sockets it serves to one run, and refuses the rest at once.
//
// golang.org/x/net/netutil.LimitListener bounds the same count by not calling
// Accept past it: the excess waits in the kernel's backlog, its client gets
// no answer, and a unix socket's connect blocks or fails once the backlog is
// full. A socket the worker serves to an untrusted run needs the opposite:
// the run learns at once that it is past its cap, and the server keeps
// accepting, so nothing waits on the run. A Limit accepts every connection,
// hands at most its maximum to the server, and answers each one past that
// with a fixed reply and closes it; the descriptor it held is the server's
// for that short write only.
//
// The coordination socket (coordination.MaxConnsPerSession) and the egress
// proxy's socket (egress.Config.MaxConns) both use it. It imports only the
// standard library.
package connlimit

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ReplyTimeout bounds writing the reply to a connection refused for being
// past the limit; a refused connection that does not take it in time is
// closed anyway.
const ReplyTimeout = 100 * time.Millisecond

// Limit counts the connections open at once across the listeners it wraps
// and refuses those past its maximum. A server that opens its listener again
// (after a failure) wraps the new one with the same Limit, so connections
// accepted before still count. Safe for concurrent use.
type Limit struct {
	max      int
	reply    []byte
	onRefuse func()
	open     atomic.Int64
	refused  atomic.Int64
}

// New returns a Limit of max connections open at once. reply is written to
// each connection refused for being past max (within ReplyTimeout; nil
// writes nothing); onRefuse, when not nil, is then called once per refused
// connection, on the goroutine that called Accept, before the connection is
// closed (so the refusal is counted by the time its client sees the close),
// and must not block. New panics when max is less than 1: a socket that can hold no
// connection is a programming error, not a cap.
func New(max int, reply []byte, onRefuse func()) *Limit {
	if max < 1 {
		panic(fmt.Sprintf("connlimit: max %d, want at least 1", max))
	}
	return &Limit{max: max, reply: reply, onRefuse: onRefuse}
}

// Max returns the most connections the Limit lets be open at once.
func (lim *Limit) Max() int { return lim.max }

// Open returns how many connections accepted through the Limit's listeners
// are open now (not yet closed).
func (lim *Limit) Open() int { return int(lim.open.Load()) }

// Refused returns how many connections the Limit refused so far.
func (lim *Limit) Refused() int64 { return lim.refused.Load() }

// Listener returns l under the limit. Its Accept returns the next connection
// within the limit, which frees its place when closed (once, however often
// Close is called; a half-close with CloseWrite does not free it). A
// connection past the limit is answered with the reply and closed in place,
// and Accept waits for the next one; Accept's errors are l's. Closing the
// returned listener closes l.
func (lim *Limit) Listener(l net.Listener) net.Listener {
	return &listener{Listener: l, lim: lim}
}

// listener is a net.Listener under a Limit.
type listener struct {
	net.Listener
	lim *Limit
}

// Accept returns the next connection within the limit; see Limit.Listener.
func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.lim.open.Add(1) <= int64(l.lim.max) {
			return &conn{Conn: c, lim: l.lim}, nil
		}
		l.lim.open.Add(-1)
		l.lim.refused.Add(1)
		if len(l.lim.reply) > 0 {
			_ = c.SetWriteDeadline(time.Now().Add(ReplyTimeout))
			_, _ = c.Write(l.lim.reply)
		}
		if l.lim.onRefuse != nil {
			l.lim.onRefuse()
		}
		_ = c.Close()
	}
}

// conn is a connection within a Limit; it gives its place back when closed.
type conn struct {
	net.Conn
	lim  *Limit
	once sync.Once
}

// Close closes the connection and frees its place in the limit, once.
func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.lim.open.Add(-1) })
	return err
}

// CloseWrite half-closes the connection when the underlying one can (a unix
// or TCP connection), so a server relaying a stream can pass its end on; it
// returns an error, and closes nothing, when the underlying one cannot.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("connlimit: %T cannot half-close", c.Conn)
}
