package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/messages"
)

// Resolver resolves a host name to addresses; *net.Resolver implements it.
// Tests swap in a fixed table.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Config configures the egress proxy sessions. The zero value is usable.
type Config struct {
	// Resolver resolves allowed names; default net.DefaultResolver. The
	// proxy connects to the address it resolved and checked, never to the
	// name again, so a name cannot change its answer between check and use.
	Resolver Resolver
	// Publish receives one EgressEvent per attempt: refused attempts at
	// once, allowed ones when they end. It must not block for long. Nil
	// publishes nothing.
	Publish func(messages.EgressEvent)
	// Observe, when set, is told of every attempt (allowed or not), past
	// MaxEvents too: for metrics. It must not block.
	Observe func(allowed bool)
	// Logger receives the sessions' own log lines (restarts, failures).
	Logger zerolog.Logger
	// OwnAddrs are the host's own addresses, refused unless listed.
	// Default: the addresses of the host's interfaces when Open is called.
	OwnAddrs []netip.Addr
	// DialTimeout bounds the connection to an allowed host, and the TLS
	// handshake of the proxy's own connection to an injected one. Default
	// 10s.
	DialTimeout time.Duration
	// HelloTimeout bounds the wait for a tunnel's TLS ClientHello. Default 10s.
	HelloTimeout time.Duration
	// MaxConns is the most connections the run has open at once to its
	// session's socket, whatever each carries: a request being read, one
	// waiting for its host, a tunnel, a kept-alive connection between
	// requests. A connection past it is answered 429 Too Many Requests and
	// closed at once, and is a refused attempt (an event without a host:
	// its request is never read). Default DefaultMaxConns; negative is an
	// error.
	MaxConns int
	// RequestReadTimeout bounds reading one whole request from the run,
	// headers and body together (a plain-HTTP request, or a CONNECT before
	// its tunnel), from its first byte; the headers alone have at most 10
	// seconds of it. A request not read in time is cut off and its
	// connection closed. Default DefaultRequestReadTimeout; negative is an
	// error.
	RequestReadTimeout time.Duration
	// IdleTimeout closes a connection of the run that moves no byte either
	// way for that long: a tunnel, a request waiting for its host's answer,
	// an answer the run does not read. A kept-alive connection between
	// requests is closed after a minute, or IdleTimeout when shorter. The
	// attempt it carried is recorded. Default DefaultIdleTimeout; negative
	// is an error.
	IdleTimeout time.Duration
	// MaxEvents is the most events one session publishes; later attempts
	// are only counted (EgressTotals.EventsDropped). Default 1000.
	MaxEvents int
	// CA signs the certificates the proxy shows a run for the hosts it
	// injects a key into (Injection); nil turns injection off (Open then
	// refuses injections).
	CA *tls.Certificate
	// UpstreamRoots verifies the real hosts' certificates when the proxy
	// opens its own TLS connection for an injected host; nil means the
	// system's roots.
	UpstreamRoots *x509.CertPool
	// MaxMetered is the most model requests of a run (to hosts it injects
	// a key for) metered at once: a further one waits until one ends (it
	// is never let through unmetered). It bounds the memory metering
	// holds for a run (see maxMeteredJSON). Default DefaultMaxMetered;
	// negative is an error.
	MaxMetered int
	// MaxAsks is the most questions one session puts to an operator
	// (AskFor): each waiting connection is one, and one not answered in
	// time is asked again. Past it a connection to an ask-list host is
	// refused without asking. Default DefaultMaxAsks.
	MaxAsks int
	// Unmetered turns the metering of injected hosts off (no usage read,
	// no budgets enforced): the injected path as it was before metering,
	// the baseline make bench measures the metering's own cost against.
	// A worker never sets it.
	Unmetered bool
	// RestartDelay is how long a session's listener stays down after it
	// failed (or Kill) before it is opened again. Default 200ms.
	RestartDelay time.Duration
}

// The bounds of one run's egress socket: the defaults of Config.MaxConns,
// Config.RequestReadTimeout and Config.IdleTimeout. With them, the worker
// holds at most about 2×DefaultMaxConns+5 descriptors for a run's egress
// (the run's connections, their upstream ends, a few idle upstream ones,
// the listener), whatever the run does.
const (
	// DefaultMaxConns is the most connections a run has open to its egress
	// socket at once.
	DefaultMaxConns = 64
	// DefaultRequestReadTimeout bounds reading one whole request (headers
	// and body) from the run.
	DefaultRequestReadTimeout = time.Minute
	// DefaultMaxMetered is the most model requests of a run metered at
	// once.
	DefaultMaxMetered = 16
	// DefaultMaxAsks is the most questions a run puts to an operator.
	DefaultMaxAsks = 100
	// DefaultIdleTimeout closes a connection of the run that moves no byte
	// either way for 15 minutes: longer than the 10 minutes the hosted-model
	// SDKs wait for an answer by default, so a slow answer is not cut.
	DefaultIdleTimeout = 15 * time.Minute
)

// Bounds of the session's server that follow from the Config's.
const (
	// headerTimeout bounds reading a request's headers (or
	// RequestReadTimeout when shorter).
	headerTimeout = 10 * time.Second
	// keepAliveIdle closes a kept-alive connection between requests (or
	// IdleTimeout when shorter).
	keepAliveIdle = time.Minute
	// maxIdleUpstream bounds the session's idle connections to hosts, kept
	// for plain-HTTP and injected requests.
	maxIdleUpstream = 4
)

// validate returns an error naming the first bound that is negative.
func (c Config) validate() error {
	switch {
	case c.MaxConns < 0:
		return fmt.Errorf("egress: MaxConns %d is negative", c.MaxConns)
	case c.RequestReadTimeout < 0:
		return fmt.Errorf("egress: RequestReadTimeout %s is negative", c.RequestReadTimeout)
	case c.IdleTimeout < 0:
		return fmt.Errorf("egress: IdleTimeout %s is negative", c.IdleTimeout)
	case c.MaxMetered < 0:
		return fmt.Errorf("egress: MaxMetered %d is negative", c.MaxMetered)
	}
	return nil
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.Resolver == nil {
		c.Resolver = net.DefaultResolver
	}
	if c.OwnAddrs == nil {
		c.OwnAddrs = ownAddrs()
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.HelloTimeout == 0 {
		c.HelloTimeout = 10 * time.Second
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.RequestReadTimeout == 0 {
		c.RequestReadTimeout = DefaultRequestReadTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxEvents == 0 {
		c.MaxEvents = 1000
	}
	if c.MaxMetered == 0 {
		c.MaxMetered = DefaultMaxMetered
	}
	if c.MaxAsks <= 0 {
		c.MaxAsks = DefaultMaxAsks
	}
	if c.RestartDelay == 0 {
		c.RestartDelay = 200 * time.Millisecond
	}
	return c
}
