package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/elazarl/goproxy"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/internal/connlimit"
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

// Session is one run's egress proxy: an HTTP proxy (CONNECT and plain-HTTP
// forwarding, the mechanics of github.com/elazarl/goproxy) served on a unix
// socket that only this run's container has, enforcing the run's Policy.
// The socket is the run's identity: every attempt on it belongs to the run.
// A supervisor opens the listener again when it fails. Close ends it.
type Session struct {
	cfg    Config
	runID  string
	policy Policy
	path   string
	inject map[string]Injection // by "name:port"
	log    zerolog.Logger
	proxy  *goproxy.ProxyHttpServer
	lim    *connlimit.Limit // Config.MaxConns, across the listener's restarts

	mu       sync.Mutex
	totals   messages.EgressTotals
	events   int
	open     int                   // attempts in flight, recorded when they end
	conns    map[net.Conn]struct{} // the run's connections and the tunnels' upstream ends, closed by Kill
	srv      *http.Server
	closed   bool
	restarts int
	up       chan struct{} // closed while a listener serves; replaced on restart

	meter    meter         // the model requests to injected hosts
	metering chan struct{} // a slot per model request metered now (Config.MaxMetered)
	// life ends when Close is called (endLife): the upstream requests
	// and drains of answers the agent left (drainBody) end with it;
	// drains counts those.
	life    context.Context
	endLife context.CancelFunc
	drains  sync.WaitGroup
	asker   asker // the hosts put to an operator (egress_ask)

	done chan struct{}
}

// Injection is a header the proxy sets on every request of a run to one
// allowed host, so the secret it carries never enters the container: the
// proxy terminates the run's TLS for that host with a certificate signed by
// Config.CA and opens its own TLS connection to the real host. A header of
// the same name that the request already carries is replaced.
type Injection struct {
	// Name and Port are the host, as listed in the policy (not a wildcard).
	Name string
	Port int
	// Header is the header's name ("x-api-key", "Authorization").
	Header string
	// Value is the header's value (the secret, with any prefix such as
	// "Bearer "). Never logged, never in an event.
	Value string
}

// Open starts the egress proxy of run runID on the unix socket at path
// (mode 0666, in a directory only the run's container mounts), allowing
// what policy lists and setting the injections' headers. It returns an
// error when the socket cannot be made, for a negative bound in cfg, or for
// an injection without a CA or whose host the policy does not list.
func Open(cfg Config, runID string, policy Policy, path string, inject ...Injection) (*Session, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	byHost := make(map[string]Injection, len(inject))
	for _, in := range inject {
		in.Name = normalizeHost(in.Name)
		if cfg.CA == nil {
			return nil, fmt.Errorf("egress: header injection for %s needs a CA", in.Name)
		}
		if !policy.AllowsName(in.Name, in.Port) {
			return nil, fmt.Errorf("egress: header injection for %s:%d, which the allowlist does not list", in.Name, in.Port)
		}
		byHost[net.JoinHostPort(in.Name, strconv.Itoa(in.Port))] = in
	}
	s := &Session{
		cfg: cfg, runID: runID, policy: policy, path: path, inject: byHost,
		log:      cfg.Logger.With().Str("run_id", runID).Str("component", "egress").Logger(),
		conns:    make(map[net.Conn]struct{}),
		up:       make(chan struct{}),
		done:     make(chan struct{}),
		metering: make(chan struct{}, cfg.MaxMetered),
	}
	s.life, s.endLife = context.WithCancel(context.Background())
	s.proxy = s.newProxy()
	reason := fmt.Sprintf("too many connections to the run's egress proxy (at most %d at once)", cfg.MaxConns)
	body := "jetcrew egress: refused: " + reason + "\n"
	reply := fmt.Appendf(nil, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	s.lim = connlimit.New(cfg.MaxConns, reply, func() {
		s.record(messages.EgressEvent{Time: time.Now().UTC(), Reason: reason})
	})
	l, err := s.listen()
	if err != nil {
		return nil, err
	}
	go s.supervise(l)
	return s, nil
}

// listen opens the session's unix socket, replacing a stale one.
func (s *Session) listen() (net.Listener, error) {
	_ = os.Remove(s.path)
	l, err := net.Listen("unix", s.path)
	if err != nil {
		return nil, fmt.Errorf("egress: listen on %s: %w", s.path, err)
	}
	if err := os.Chmod(s.path, 0o666); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("egress: %w", err)
	}
	return l, nil
}

// supervise serves l; when serving stops while the session is open (the
// listener failed, or Kill), it waits RestartDelay and listens again. It
// ends when Close is called.
//
// The server holds at most MaxConns connections of the run (s.lim, also
// across restarts), reads each request within RequestReadTimeout (headers
// within headerTimeout of it), closes a kept-alive connection after
// keepAliveIdle, and every connection after IdleTimeout without a byte
// (clientConn). It has no write timeout: an answer may stream for as long as
// bytes move.
func (s *Session) supervise(l net.Listener) {
	defer close(s.done)
	for {
		srv := &http.Server{
			Handler:           s.proxy,
			ReadHeaderTimeout: min(headerTimeout, s.cfg.RequestReadTimeout),
			ReadTimeout:       s.cfg.RequestReadTimeout,
			IdleTimeout:       min(keepAliveIdle, s.cfg.IdleTimeout),
			ConnContext:       connContext,
			ErrorLog:          log.New(io.Discard, "", 0),
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = l.Close()
			return
		}
		s.srv = srv
		close(s.up)
		s.mu.Unlock()
		err := srv.Serve(connListener{Listener: s.lim.Listener(l), s: s})
		s.mu.Lock()
		s.up = make(chan struct{})
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return
		}
		s.log.Warn().Err(err).Dur("delay", s.cfg.RestartDelay).Msg("egress proxy stopped; restarting it")
		for {
			time.Sleep(s.cfg.RestartDelay)
			if s.isClosed() {
				return
			}
			var lerr error
			if l, lerr = s.listen(); lerr == nil {
				break
			}
			s.log.Warn().Err(lerr).Msg("egress proxy restart failed; retrying")
		}
		s.mu.Lock()
		s.restarts++
		s.mu.Unlock()
	}
}

func (s *Session) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Kill stops the session's listener and cuts every open connection, as a
// crash of the proxy would; the supervisor brings it back after
// RestartDelay. Meanwhile the run's connections fail: nothing else leads
// out. For tests and operators' drills.
func (s *Session) Kill() {
	s.mu.Lock()
	srv := s.srv
	conns := make([]net.Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
	for _, c := range conns {
		_ = c.Close()
	}
}

// WaitUp waits until the session's listener serves, or ctx ends.
func (s *Session) WaitUp(ctx context.Context) error {
	s.mu.Lock()
	up := s.up
	s.mu.Unlock()
	select {
	case <-up:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Restarts returns how often the supervisor reopened the listener.
func (s *Session) Restarts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restarts
}

// Totals returns the session's counts so far.
func (s *Session) Totals() messages.EgressTotals {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.totals
}

// closeWait bounds how long Close waits for the connections it cut to be
// recorded.
const closeWait = 5 * time.Second

// Close stops the session: the listener, every open connection and the
// supervisor, and removes the socket. It waits (up to 5s) until every
// connection it cut has been recorded, closes the idle connections to
// hosts, cuts the answers the proxy was reading to their end for a run
// that left them (each then charged its reservation), waits for the model
// usage being added to shared budgets (each addition bounded by 30s), and
// returns the final totals. Safe to call twice.
func (s *Session) Close() messages.EgressTotals {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.Kill()
	<-s.done
	_ = os.Remove(s.path)
	for deadline := time.Now().Add(closeWait); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		s.mu.Lock()
		open := s.open
		s.mu.Unlock()
		if open == 0 {
			break
		}
	}
	s.endLife()
	s.drains.Wait() // each ends with life
	s.proxy.Tr.CloseIdleConnections()
	s.meter.spends.Wait() // each bounded by spendTimeout
	return s.Totals()
}

// record counts an attempt and publishes its event, within MaxEvents.
func (s *Session) record(ev messages.EgressEvent) {
	ev.RunID = s.runID
	ev.DurationMS = time.Since(ev.Time).Milliseconds()
	s.mu.Lock()
	if ev.Allowed {
		s.totals.Allowed++
		s.totals.BytesUp += ev.BytesUp
		s.totals.BytesDown += ev.BytesDown
		if ev.UpstreamFailed() {
			s.totals.UpstreamFailed++
		}
	} else {
		s.totals.Refused++
	}
	publish := s.events < s.cfg.MaxEvents
	if publish {
		s.events++
	} else {
		s.totals.EventsDropped++
	}
	s.mu.Unlock()
	switch { // past MaxEvents, an attempt is only counted, not logged either
	case publish && !ev.Allowed:
		s.log.Info().Str("host", ev.Host).Int("port", ev.Port).Str("reason", ev.Reason).Msg("egress refused")
	case publish && ev.UpstreamFailed():
		s.log.Warn().Str("host", ev.Host).Int("port", ev.Port).Str("reason", ev.Reason).Msg("egress upstream failed")
	}
	if s.cfg.Observe != nil {
		s.cfg.Observe(ev.Allowed)
	}
	if publish && s.cfg.Publish != nil {
		s.cfg.Publish(ev)
	}
}

// begin counts an allowed attempt in flight until end, so that Close waits
// for its event. The attempts in flight are at most the run's connections
// (Config.MaxConns): each carries one at a time.
func (s *Session) begin() {
	s.mu.Lock()
	s.open++
	s.mu.Unlock()
}

func (s *Session) end() {
	s.mu.Lock()
	s.open--
	s.mu.Unlock()
}

func (s *Session) track(c net.Conn, on bool) {
	s.mu.Lock()
	if on {
		s.conns[c] = struct{}{}
	} else {
		delete(s.conns, c)
	}
	s.mu.Unlock()
}

// decide applies the policy to a requested host and port. It returns the
// normalised host and the address to connect to, or the refusal's reason.
//
// A name the allowlist does not list but the session's ask list does
// (AskFor) is put to the operator first: the connection waits for the
// answer, which ev.Decision records (ev may be nil).
func (s *Session) decide(ctx context.Context, host string, port int, ev *messages.EgressEvent) (string, netip.AddrPort, string) {
	host = normalizeHost(host)
	if a, err := netip.ParseAddr(host); err == nil {
		a = a.Unmap()
		if !s.policy.ListsAddr(a, port) {
			return host, netip.AddrPort{}, "an address literal is not in the profile's egress allowlist (list the name, or the address itself)"
		}
		return host, netip.AddrPortFrom(a, uint16(port)), ""
	}
	if !s.policy.AllowsName(host, port) {
		d, asked := s.askOperator(ctx, host, port)
		if !asked {
			return host, netip.AddrPort{}, "not in the profile's egress allowlist"
		}
		if ev != nil {
			ev.Decision = d.String()
		}
		if !d.Allow {
			return host, netip.AddrPort{}, "asked: " + d.String()
		}
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()
	addrs, err := s.cfg.Resolver.LookupNetIP(rctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return host, netip.AddrPort{}, fmt.Sprintf("does not resolve: %v", err)
	}
	reason := ""
	for _, a := range addrs {
		a = a.Unmap()
		why := blockedReason(a, s.cfg.OwnAddrs)
		if why == "" || s.policy.ListsAddr(a, port) {
			return host, netip.AddrPortFrom(a, uint16(port)), ""
		}
		if reason == "" {
			reason = fmt.Sprintf("resolves to %s (%s), which the profile does not list", why, a)
		}
	}
	return host, netip.AddrPort{}, reason
}

// splitHostPort splits a request's host and port; def is the port when
// none is given (0: a port is required).
func splitHostPort(hostport string, def int) (string, int, error) {
	host, portS, err := net.SplitHostPort(hostport)
	if err != nil {
		if def == 0 {
			return "", 0, fmt.Errorf("%q has no port", hostport)
		}
		return hostport, def, nil
	}
	port, err := strconv.Atoi(portS)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", hostport)
	}
	return host, port, nil
}

var errRefused = errors.New("refused")
