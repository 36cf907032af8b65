package coordination

import (
	"fmt"
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

// tooManyConns is the whole reply to a connection past MaxConnsPerSession
// (connlimit writes it, then closes the connection).
var tooManyConns = func() []byte {
	body := fmt.Sprintf(`{"code":%q,"error":"%s: too many connections to the socket (at most %d at once)"}`,
		relay.CodeUnavailable, relay.ErrUnavailable, MaxConnsPerSession)
	return fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}()
