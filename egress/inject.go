package egress

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/elazarl/goproxy"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// mitmTarget is a CONNECT to a host the proxy injects a header for, kept in
// goproxy's UserData for the requests read from the terminated tunnel.
type mitmTarget struct {
	name   string
	port   int
	target netip.AddrPort
	inj    Injection
	// conn is the context of the run's connection (connCtx): the
	// requests read from the tunnel go upstream in it.
	conn context.Context
}

// injection returns the injection for host:port, if any.
func (s *Session) injection(host string, port int) (Injection, bool) {
	in, ok := s.inject[net.JoinHostPort(host, strconv.Itoa(port))]
	return in, ok
}

// mitmAction terminates the run's TLS for an injected host with a
// certificate signed by the CA (goproxy's ConnectMitm), so handleInjected
// sees each request.
func (s *Session) mitmAction(ctx *goproxy.ProxyCtx, ev messages.EgressEvent, target netip.AddrPort, in Injection) *goproxy.ConnectAction {
	ctx.UserData = &mitmTarget{name: ev.Host, port: ev.Port, target: target, inj: in, conn: connCtx(ctx.Req)}
	return &goproxy.ConnectAction{Action: goproxy.ConnectMitm, TLSConfig: goproxy.TLSConfigFromCA(s.cfg.CA)}
}

// handleInjected handles a request read from a terminated tunnel: it must
// be HTTPS to the tunnel's own host; it is metered (beginModel), or
// answered with the provider's quota error when the run has reached a
// budget; the injection's header is set (replacing any the request
// carried) and the request goes to the checked address over the proxy's
// own TLS connection, which verifies the real host's certificate.
func (s *Session) handleInjected(req *http.Request, ctx *goproxy.ProxyCtx, m *mitmTarget) (*http.Request, *http.Response) {
	ev := messages.EgressEvent{Time: time.Now().UTC(), Method: req.Method, Host: m.name, Port: m.port}
	refuse := func(reason string) (*http.Request, *http.Response) {
		ev.Reason = reason
		s.record(ev)
		return req, goproxy.NewResponse(req, "text/plain", http.StatusForbidden, "jetcrew egress: refused: "+reason+"\n")
	}
	if req.URL.Scheme != "https" {
		return refuse("plain HTTP inside a tunnel to a host the proxy adds a key for: only TLS")
	}
	host, port, err := splitHostPort(req.URL.Host, 443)
	if err != nil || normalizeHost(host) != m.name || port != m.port {
		return refuse(fmt.Sprintf("the request names %q inside the tunnel to %s", req.URL.Host, net.JoinHostPort(m.name, strconv.Itoa(m.port))))
	}
	var model *metered
	var refusal *http.Response
	if !s.cfg.Unmetered {
		model, refusal = s.beginModel(req, m.name)
	}
	if refusal != nil {
		ev.Reason = refusal.Header.Get(refusedHeader)
		s.record(ev)
		return req, refusal
	}
	s.begin()
	req.Header.Del(m.inj.Header)
	req.Header.Set(m.inj.Header, m.inj.Value)
	ev.Allowed, ev.Addr = true, m.target.String()
	a := &attempt{ev: ev, model: model}
	if req.Body != nil {
		a.up = &countingReader{r: req.Body}
		req.Body = a.up
	}
	up := m.conn
	if model != nil {
		model.up = a.up
		if model.strict {
			up = s.upstreamCtx(model, m.conn)
		}
	}
	ctx.UserData = a
	ctx.RoundTripper = goproxy.RoundTripperFunc(func(req *http.Request, pctx *goproxy.ProxyCtx) (*http.Response, error) {
		return s.roundTripInjected(req, pctx, m, a)
	})
	return req.WithContext(context.WithValue(up, dialKey{}, m.target)), nil
}

// roundTripInjected sends req, a request of attempt a to the injected host
// of m, and returns the host's answer. When the host cannot be reached or
// does not answer, it records the attempt with the cause and answers the
// run itself (upstreamAnswer: 502 in the provider's error shape) instead of
// closing the run's connection, which an agent's client could read as an
// empty answer. goproxy's MITM loop skips the response handlers when the
// round trip fails, so the failure is recorded here: no attempt is lost and
// Close does not wait for it.
func (s *Session) roundTripInjected(req *http.Request, pctx *goproxy.ProxyCtx, m *mitmTarget, a *attempt) (*http.Response, error) {
	resp, err := s.proxy.Tr.RoundTrip(req)
	if err == nil {
		return resp, nil
	}
	cause, final := s.upstreamFailure(m.conn, err)
	s.finishAttempt(a, 0, cause)
	format := usage.Detect(req.Method, req.URL.Path)
	if a.model != nil {
		format = a.model.ev.Format
		s.endModel(a.model, usage.Result{})
	}
	if cause == "" {
		return nil, err // the run's connection has ended: no one to answer
	}
	pctx.UserData = nil // the proxy's own answer: handleResponse leaves it alone
	return upstreamAnswer(req, format, net.JoinHostPort(m.name, strconv.Itoa(m.port)), cause, final), nil
}

// certStore caches the certificates signed for injected hosts, by name.
type certStore struct {
	mu    sync.Mutex
	certs map[string]*tls.Certificate
}

// Fetch implements goproxy.CertStorage.
func (c *certStore) Fetch(host string, gen func() (*tls.Certificate, error)) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cert, ok := c.certs[host]; ok {
		return cert, nil
	}
	cert, err := gen()
	if err != nil {
		return nil, err
	}
	if c.certs == nil {
		c.certs = map[string]*tls.Certificate{}
	}
	c.certs[host] = cert
	return cert, nil
}
