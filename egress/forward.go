package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/elazarl/goproxy"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// dialKey carries the checked address of a plain-HTTP request to the
// transport's dialer.
type dialKey struct{}

// forwarder is a session's goproxy handlers: it decides each CONNECT
// (hijacked into tunnels, or terminated by inject for an injected host) and
// each plain-HTTP request (forwarded to the checked address only), and
// records every attempt.
type forwarder struct {
	events  *recorder
	gate    *gate
	meter   *meter
	tunnels *tunnels
	inject  *injector
	idle    time.Duration // Config.IdleTimeout
}

// newTransport returns the transport of a session's requests to hosts: it
// dials only the checked address a request carries (dialKey), and
// verifies a host's certificate with Config.UpstreamRoots.
func newTransport(cfg Config) *http.Transport {
	d := &net.Dialer{Timeout: cfg.DialTimeout}
	return &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			ap, ok := ctx.Value(dialKey{}).(netip.AddrPort)
			if !ok {
				return nil, errRefused
			}
			return d.DialContext(ctx, "tcp", ap.String())
		},
		TLSClientConfig:     &tls.Config{RootCAs: cfg.UpstreamRoots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: cfg.DialTimeout,
		MaxIdleConns:        maxIdleUpstream,
		MaxIdleConnsPerHost: maxIdleUpstream,
		IdleConnTimeout:     30 * time.Second,
	}
}

// newProxy builds the goproxy server with f's handlers and transport tr:
// CONNECT is hijacked into our own tunnel (SNI check, byte counts), plain
// HTTP is forwarded by tr to the checked address only.
func newProxy(f *forwarder, tr *http.Transport) *goproxy.ProxyHttpServer {
	p := goproxy.NewProxyHttpServer()
	p.Logger = log.New(io.Discard, "", 0)
	p.NonproxyHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev := messages.EgressEvent{Time: time.Now().UTC(), Method: r.Method, Host: r.Host,
			Reason: "not a proxy request (send an absolute URL, or CONNECT)"}
		if host, port, err := splitHostPort(r.Host, 80); err == nil {
			ev.Host, ev.Port = normalizeHost(host), port
		}
		f.events.record(ev)
		http.Error(w, "jetcrew egress proxy: send proxy requests (absolute URL or CONNECT)", http.StatusBadRequest)
	})
	p.Tr = tr
	p.ConnectDial = func(string, string) (net.Conn, error) { return nil, errRefused }
	p.CertStore = &certStore{}
	p.OnRequest().HandleConnectFunc(f.handleConnect)
	p.OnRequest().DoFunc(f.handleHTTP)
	p.OnResponse().DoFunc(f.handleResponse)
	return p
}

// handleHTTP decides a plain-HTTP proxy request: refused with 403 and an
// event (a protocol upgrade too), or sent on to goproxy's transport with the
// checked address, in the context of the run's connection (connCtx). A
// request read from a terminated tunnel goes to the injector.
func (f *forwarder) handleHTTP(req *http.Request, ctx *goproxy.ProxyCtx) (*http.Request, *http.Response) {
	if m, ok := ctx.UserData.(*mitmTarget); ok {
		return f.inject.handle(req, ctx, m)
	}
	ev := messages.EgressEvent{Time: time.Now().UTC(), Method: req.Method}
	if req.URL.Scheme != "http" {
		ev.Host = req.URL.Host
		return req, f.events.refuse(req, ev, fmt.Sprintf("scheme %q: only plain http is forwarded; use CONNECT for TLS", req.URL.Scheme))
	}
	host, port, err := splitHostPort(req.URL.Host, 80)
	if err != nil {
		ev.Host = req.URL.Host
		return req, f.events.refuse(req, ev, err.Error())
	}
	ev.Port = port
	if req.Header.Get("Upgrade") != "" {
		// goproxy's relay of an upgraded connection (WebSocket) never
		// closes the run's side and skips the response hooks that record
		// the attempt; wss:// goes through CONNECT like any TLS.
		ev.Host = normalizeHost(host)
		return req, f.events.refuse(req, ev, fmt.Sprintf("protocol upgrade (Upgrade: %q) over plain HTTP is not forwarded; use TLS through CONNECT (wss://)", req.Header.Get("Upgrade")))
	}
	var target netip.AddrPort
	var reason string
	ev.Host, target, reason = f.gate.decide(connCtx(req), host, port, &ev)
	if reason == "" {
		reason = f.gate.meteredAddr(connCtx(req), target)
	}
	if reason != "" {
		return req, f.events.refuse(req, ev, reason)
	}
	ctx.UserData = f.events.start(req, ev, target)
	return req.WithContext(context.WithValue(connCtx(req), dialKey{}, target)), nil
}

// handleResponse counts an allowed plain-HTTP response's body and records
// the attempt when the body is closed (or at once when the request failed).
func (f *forwarder) handleResponse(resp *http.Response, ctx *goproxy.ProxyCtx) *http.Response {
	a, ok := ctx.UserData.(*attempt)
	if !ok {
		return resp
	}
	if resp == nil {
		return f.upstreamFailed(a, ctx)
	}
	if a.model != nil {
		f.meter.wrap(a.model, resp)
	}
	cr := &countingReader{r: resp.Body}
	resp.Body = &closeHook{countingReader: cr, close: func() { f.events.finish(a, cr.n.Load(), "") }}
	return resp
}

// upstreamFailed records a, a plain-HTTP request whose host could not be
// reached or did not answer (ctx.Error), with the cause, and returns the
// proxy's own answer to it: 502 naming the cause (nil when the run's
// connection ended first: no one to answer).
func (f *forwarder) upstreamFailed(a *attempt, ctx *goproxy.ProxyCtx) *http.Response {
	err := ctx.Error
	if err == nil {
		err = errors.New("no answer")
	}
	cause, final := upstreamFailure(connCtx(ctx.Req), err, f.idle)
	f.events.finish(a, 0, cause)
	if a.model != nil {
		f.meter.end(a.model, usage.Result{})
	}
	if cause == "" {
		return nil
	}
	return upstreamAnswer(ctx.Req, "", net.JoinHostPort(a.ev.Host, strconv.Itoa(a.ev.Port)), cause, final)
}
