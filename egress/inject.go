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

// injector serves a session's CONNECTs to the hosts it injects a key for:
// it terminates the run's TLS, meters each request read from the tunnel
// (meter) and sends it with the key over the proxy's own TLS connection
// (tr).
type injector struct {
	ca        *tls.Certificate // Config.CA
	unmetered bool             // Config.Unmetered
	events    *recorder
	meter     *meter
	tr        *http.Transport // the proxy's own, to the real hosts
	idle      time.Duration   // Config.IdleTimeout
}

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

// connect terminates the run's TLS for an injected host with a
// certificate signed by the CA (goproxy's ConnectMitm), so handle sees
// each request.
func (j *injector) connect(ctx *goproxy.ProxyCtx, ev messages.EgressEvent, target netip.AddrPort, in Injection) *goproxy.ConnectAction {
	ctx.UserData = &mitmTarget{name: ev.Host, port: ev.Port, target: target, inj: in, conn: connCtx(ctx.Req)}
	return &goproxy.ConnectAction{Action: goproxy.ConnectMitm, TLSConfig: goproxy.TLSConfigFromCA(j.ca)}
}

// handle handles a request read from a terminated tunnel: it must
// be HTTPS to the tunnel's own host; it is metered (meter.begin), or
// answered with the provider's quota error when the run has reached a
// budget; the injection's header is set (replacing any the request
// carried) and the request goes to the checked address over the proxy's
// own TLS connection, which verifies the real host's certificate.
func (j *injector) handle(req *http.Request, ctx *goproxy.ProxyCtx, m *mitmTarget) (*http.Request, *http.Response) {
	ev := messages.EgressEvent{Time: time.Now().UTC(), Method: req.Method, Host: m.name, Port: m.port}
	if req.URL.Scheme != "https" {
		return req, j.events.refuse(req, ev, "plain HTTP inside a tunnel to a host the proxy adds a key for: only TLS")
	}
	host, port, err := splitHostPort(req.URL.Host, 443)
	if err != nil || normalizeHost(host) != m.name || port != m.port {
		return req, j.events.refuse(req, ev, fmt.Sprintf("the request names %q inside the tunnel to %s", req.URL.Host, net.JoinHostPort(m.name, strconv.Itoa(m.port))))
	}
	var model *metered
	var refusal *http.Response
	if !j.unmetered {
		model, refusal = j.meter.begin(req, m.name)
	}
	if refusal != nil {
		ev.Reason = refusal.Header.Get(refusedHeader)
		j.events.record(ev)
		return req, refusal
	}
	req.Header.Del(m.inj.Header)
	req.Header.Set(m.inj.Header, m.inj.Value)
	a := j.events.start(req, ev, m.target)
	a.model = model
	up := m.conn
	if model != nil {
		model.up = a.up
		if model.strict {
			up = j.meter.upstreamCtx(model, m.conn)
		}
	}
	ctx.UserData = a
	ctx.RoundTripper = goproxy.RoundTripperFunc(func(req *http.Request, pctx *goproxy.ProxyCtx) (*http.Response, error) {
		return j.roundTrip(req, pctx, m, a)
	})
	return req.WithContext(context.WithValue(up, dialKey{}, m.target)), nil
}

// roundTrip sends req, a request of attempt a to the injected host
// of m, and returns the host's answer. When the host cannot be reached or
// does not answer, it records the attempt with the cause and answers the
// run itself (upstreamAnswer: 502 in the provider's error shape) instead of
// closing the run's connection, which an agent's client could read as an
// empty answer. goproxy's MITM loop skips the response handlers when the
// round trip fails, so the failure is recorded here: no attempt is lost and
// Close does not wait for it.
func (j *injector) roundTrip(req *http.Request, pctx *goproxy.ProxyCtx, m *mitmTarget, a *attempt) (*http.Response, error) {
	resp, err := j.tr.RoundTrip(req)
	if err == nil {
		return resp, nil
	}
	cause, final := upstreamFailure(m.conn, err, j.idle)
	j.events.finish(a, 0, cause)
	format := usage.Detect(req.Method, req.URL.Path)
	if a.model != nil {
		format = a.model.ev.Format
		j.meter.end(a.model, usage.Result{})
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
