package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/elazarl/goproxy"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/egress/policy"
	"github.com/jetcrew/jetcrew/internal/connlimit"
	"github.com/jetcrew/jetcrew/messages"
)

// Session is one run's egress proxy: an HTTP proxy (CONNECT and plain-HTTP
// forwarding, the mechanics of github.com/elazarl/goproxy) served on a unix
// socket that only this run's container has, enforcing the run's Policy.
// The socket is the run's identity: every attempt on it belongs to the run.
// A supervisor opens the listener again when it fails. Close ends it.
//
// The session composes one part per concern: its events (recorder), its
// policy (gate, with the operator's answers), its tunnels and forwarding
// (forwarder, tunnels, injector), its metering (meter) and the run's
// connections (connSet); it owns the listener and its supervisor.
type Session struct {
	cfg   Config
	path  string
	log   zerolog.Logger
	proxy *goproxy.ProxyHttpServer
	lim   *connlimit.Limit // Config.MaxConns, across the listener's restarts

	events *recorder // every attempt: its event and the run's totals
	gate   *gate     // what the run may reach, and the operator's answers
	meter  *meter    // the model requests to injected hosts
	conns  *connSet  // the run's connections and the tunnels' upstream ends, closed by Kill

	mu       sync.Mutex
	srv      *http.Server
	served   bool // Serve started the supervisor
	closed   bool
	restarts int
	up       chan struct{} // closed while a listener serves; replaced on restart

	done chan struct{}
}

// Open starts the egress proxy of run runID on the unix socket at path
// (mode 0666, in a directory only the run's container mounts), allowing
// what allow lists and setting the injections' headers: New, then Serve.
// It returns New's errors, and an error when the socket cannot be made.
func Open(cfg Config, runID string, allow policy.Policy, path string, inject ...Injection) (*Session, error) {
	s, err := New(cfg, runID, allow, path, inject...)
	if err != nil {
		return nil, err
	}
	if err := s.Serve(); err != nil {
		return nil, err
	}
	return s, nil
}

// New makes the egress proxy of run runID, to be served on the unix
// socket at path, allowing what allow lists and setting the injections'
// headers, without serving it yet: what must be in place before the
// run's first connection (Meter, AskFor, Carry) is set before Serve. It
// returns an error for a negative bound in cfg, or for an injection
// without a CA or whose host the policy does not list.
func New(cfg Config, runID string, allow policy.Policy, path string, inject ...Injection) (*Session, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	byHost, err := injections(cfg, allow, inject)
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger.With().Str("run_id", runID).Str("component", "egress").Logger()
	s := &Session{
		cfg: cfg, path: path, log: logger,
		events: newRecorder(cfg, runID, logger),
		gate:   newGate(cfg, allow, byHost),
		meter:  newMeter(cfg, runID, logger),
		conns:  newConnSet(cfg.IdleTimeout, logger),
		up:     make(chan struct{}),
		done:   make(chan struct{}),
	}
	tr := newTransport(cfg)
	s.proxy = newProxy(&forwarder{
		events: s.events, gate: s.gate, meter: s.meter, idle: cfg.IdleTimeout,
		tunnels: &tunnels{events: s.events, conns: s.conns, dialTimeout: cfg.DialTimeout, helloTimeout: cfg.HelloTimeout, idle: cfg.IdleTimeout},
		inject:  &injector{ca: cfg.CA, unmetered: cfg.Unmetered, events: s.events, meter: s.meter, tr: tr, idle: cfg.IdleTimeout},
	}, tr)
	reason := fmt.Sprintf("too many connections to the run's egress proxy (at most %d at once)", cfg.MaxConns)
	body := "jetcrew egress: refused: " + reason + "\n"
	reply := fmt.Appendf(nil, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	s.lim = connlimit.New(cfg.MaxConns, reply, func() {
		s.events.record(messages.EgressEvent{Time: time.Now().UTC(), Reason: reason})
	})
	return s, nil
}

// Serve opens the session's unix socket (a stale one at its path is
// replaced) and serves it until Close, reopening it when it fails
// (supervise). It returns an error when the socket cannot be made, or
// when the session was closed or is served already.
func (s *Session) Serve() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return errors.New("egress: the session is closed")
	case s.served:
		return errors.New("egress: the session is served already")
	}
	l, err := s.listen()
	if err != nil {
		return err
	}
	s.served = true
	go s.supervise(l)
	return nil
}

// injections returns the injections by "name:port", their names
// normalised, or an error for one without a CA or whose host allow does
// not list.
func injections(cfg Config, allow policy.Policy, inject []Injection) (map[string]Injection, error) {
	byHost := make(map[string]Injection, len(inject))
	for _, in := range inject {
		in.Name = normalizeHost(in.Name)
		if cfg.CA == nil {
			return nil, fmt.Errorf("egress: header injection for %s needs a CA", in.Name)
		}
		if !allow.AllowsName(in.Name, in.Port) {
			return nil, fmt.Errorf("egress: header injection for %s:%d, which the allowlist does not list", in.Name, in.Port)
		}
		byHost[net.JoinHostPort(in.Name, strconv.Itoa(in.Port))] = in
	}
	return byHost, nil
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
		err := srv.Serve(connListener{Listener: s.lim.Listener(l), conns: s.conns})
		s.mu.Lock()
		s.up = make(chan struct{})
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return
		}
		s.log.Warn().Err(err).Dur("delay", s.cfg.RestartDelay).Msg("egress proxy stopped; restarting it")
		if l = s.relisten(); l == nil {
			return
		}
	}
}

// relisten opens the listener again after RestartDelay, retrying until it
// opens (and counting the restart) or the session is closed (nil).
func (s *Session) relisten() net.Listener {
	for {
		time.Sleep(s.cfg.RestartDelay)
		if s.isClosed() {
			return nil
		}
		l, err := s.listen()
		if err == nil {
			s.mu.Lock()
			s.restarts++
			s.mu.Unlock()
			return l
		}
		s.log.Warn().Err(err).Msg("egress proxy restart failed; retrying")
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
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
	s.conns.closeAll()
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
func (s *Session) Totals() messages.EgressTotals { return s.events.totals() }

// closeWait bounds how long Close waits for the connections it cut to be
// recorded.
const closeWait = 5 * time.Second

// Close stops the session: the listener, every open connection and the
// supervisor, and removes the socket (of a session served). It waits (up to 5s) until every
// connection it cut has been recorded, closes the idle connections to
// hosts, cuts the answers the proxy was reading to their end for a run
// that left them (each then charged its reservation), waits for the model
// usage being added to shared budgets (each addition bounded by 30s), and
// returns the final totals. Safe to call twice, and on a session never
// served.
func (s *Session) Close() messages.EgressTotals {
	s.mu.Lock()
	s.closed = true
	served := s.served
	s.mu.Unlock()
	s.Kill()
	if served {
		<-s.done
		_ = os.Remove(s.path)
	}
	s.events.waitEnded(closeWait)
	s.meter.stop() // the drains of answers the agent left end with it
	s.proxy.Tr.CloseIdleConnections()
	s.meter.spends.Wait() // each bounded by spendTimeout
	return s.Totals()
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

// normalizeHost lowercases a requested host and drops a trailing dot.
func normalizeHost(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }

var errRefused = errors.New("refused")
