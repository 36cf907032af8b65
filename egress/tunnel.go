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
	"sync"
	"sync/atomic"
	"time"

	"github.com/elazarl/goproxy"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// dialKey carries the checked address of a plain-HTTP request to the
// transport's dialer.
type dialKey struct{}

// attempt is a plain-HTTP request in flight, kept in goproxy's UserData.
type attempt struct {
	ev   messages.EgressEvent
	up   *countingReader
	once sync.Once
	// model is the metering of a request to an injected host.
	model *metered
}

// newProxy builds the goproxy server with the session's policy: CONNECT is
// hijacked into our own tunnel (SNI check, byte counts), plain HTTP is
// forwarded by goproxy's transport to the checked address only.
func (s *Session) newProxy() *goproxy.ProxyHttpServer {
	p := goproxy.NewProxyHttpServer()
	p.Logger = log.New(io.Discard, "", 0)
	p.NonproxyHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev := messages.EgressEvent{Time: time.Now().UTC(), Method: r.Method, Host: r.Host,
			Reason: "not a proxy request (send an absolute URL, or CONNECT)"}
		if host, port, err := splitHostPort(r.Host, 80); err == nil {
			ev.Host, ev.Port = normalizeHost(host), port
		}
		s.record(ev)
		http.Error(w, "jetcrew egress proxy: send proxy requests (absolute URL or CONNECT)", http.StatusBadRequest)
	})
	d := &net.Dialer{Timeout: s.cfg.DialTimeout}
	p.Tr = &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			ap, ok := ctx.Value(dialKey{}).(netip.AddrPort)
			if !ok {
				return nil, errRefused
			}
			return d.DialContext(ctx, "tcp", ap.String())
		},
		TLSClientConfig:     &tls.Config{RootCAs: s.cfg.UpstreamRoots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: s.cfg.DialTimeout,
		MaxIdleConns:        maxIdleUpstream,
		MaxIdleConnsPerHost: maxIdleUpstream,
		IdleConnTimeout:     30 * time.Second,
	}
	p.ConnectDial = func(string, string) (net.Conn, error) { return nil, errRefused }
	p.CertStore = &certStore{}
	p.OnRequest().HandleConnectFunc(s.handleConnect)
	p.OnRequest().DoFunc(s.handleHTTP)
	p.OnResponse().DoFunc(s.handleResponse)
	return p
}

// handleConnect decides a CONNECT: refused with 403 and an event, or
// hijacked into tunnel.
func (s *Session) handleConnect(hostport string, ctx *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
	ev := messages.EgressEvent{Time: time.Now().UTC(), Method: http.MethodConnect}
	host, port, err := splitHostPort(hostport, 0)
	var target netip.AddrPort
	reason := ""
	if err != nil {
		ev.Host, reason = hostport, err.Error()
	} else {
		ev.Port = port
		ev.Host, target, reason = s.decide(connCtx(ctx.Req), host, port, &ev)
	}
	if reason != "" {
		ev.Reason = reason
		s.record(ev)
		ctx.Resp = goproxy.NewResponse(ctx.Req, "text/plain", http.StatusForbidden, "jetcrew egress: refused: "+reason+"\n")
		return goproxy.RejectConnect, hostport
	}
	if in, ok := s.injection(ev.Host, ev.Port); ok {
		return s.mitmAction(ctx, ev, target, in), hostport
	}
	if reason := s.meteredAddr(connCtx(ctx.Req), target); reason != "" {
		ev.Reason = reason
		s.record(ev)
		ctx.Resp = goproxy.NewResponse(ctx.Req, "text/plain", http.StatusForbidden, "jetcrew egress: refused: "+reason+"\n")
		return goproxy.RejectConnect, hostport
	}
	return &goproxy.ConnectAction{Action: goproxy.ConnectHijack, Hijack: func(_ *http.Request, client net.Conn, _ *goproxy.ProxyCtx) {
		s.tunnel(client, ev, target)
	}}, hostport
}

// tunnel serves an allowed CONNECT: it answers 200, reads the TLS
// ClientHello and checks that its SNI is the CONNECT name (for a name), dials
// the checked address and copies both ways, then records the attempt.
func (s *Session) tunnel(client net.Conn, ev messages.EgressEvent, target netip.AddrPort) {
	defer client.Close()
	s.begin()
	defer s.end()
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// Dial the checked address while the ClientHello comes: one round trip
	// less before the handshake. Nothing is sent upstream before the hello
	// passed the SNI check; a refused tunnel's connection is closed unused,
	// and a dial still under way is cancelled when the tunnel ends, so no
	// upstream descriptor outlives the run's connection.
	type dialed struct {
		c   net.Conn
		err error
	}
	dialc := make(chan dialed, 1)
	dctx, cancelDial := context.WithTimeout(context.Background(), s.cfg.DialTimeout)
	defer cancelDial()
	go func() {
		// Ends with the dial: at the latest when the tunnel returns.
		c, err := (&net.Dialer{}).DialContext(dctx, "tcp", target.String())
		dialc <- dialed{c, err}
	}()
	_ = client.SetReadDeadline(time.Now().Add(s.cfg.HelloTimeout))
	sni, hello, err := readClientHello(client)
	_ = client.SetReadDeadline(time.Time{})
	_, litErr := netip.ParseAddr(ev.Host)
	isName := litErr != nil
	switch {
	case err != nil:
		ev.Reason = "the tunnel did not start with a TLS ClientHello: " + err.Error()
	case isName && sni == "":
		ev.Reason = "the TLS ClientHello names no server (SNI)"
	case isName && normalizeHost(sni) != ev.Host:
		ev.Reason = fmt.Sprintf("TLS SNI %q does not match the CONNECT name %q", sni, ev.Host)
	}
	if ev.Reason != "" {
		s.record(ev)
		cancelDial()
		go func() {
			if d := <-dialc; d.c != nil {
				_ = d.c.Close()
			}
		}()
		return
	}
	d := <-dialc
	up, err := d.c, d.err
	ev.Allowed = true
	if err != nil {
		ev.Reason, _ = s.upstreamFailure(context.Background(), err)
		s.record(ev)
		return
	}
	ev.Addr = target.String()
	s.track(up, true)
	defer s.track(up, false)
	defer up.Close()
	n, err := up.Write(hello)
	ev.BytesUp += int64(n)
	if err == nil {
		u, d := pipe(client, up)
		ev.BytesUp += u
		ev.BytesDown += d
	}
	s.record(ev)
}

// tunnelBuf is the buffer of each direction of a tunnel: one TLS record's
// worth. The run's end is a clientConn, which counts every byte for the idle
// bound, so the kernel cannot splice a tunnel; each direction copies
// through its own buffer, held while the tunnel lives (io.Copy's default
// would be 32 KiB, through the connections' ReadFrom and WriteTo).
const tunnelBuf = 16 << 10

// pipe copies a to b and b to a until both directions end, and returns the
// bytes copied each way.
func pipe(a, b net.Conn) (aToB, bToA int64) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		bToA = copyConn(a, b)
		closeWrite(a)
	}()
	aToB = copyConn(b, a)
	closeWrite(b)
	wg.Wait()
	return aToB, bToA
}

// copyConn copies src to dst until either fails or src ends, through a
// tunnelBuf buffer, and returns the bytes copied.
func copyConn(dst io.Writer, src io.Reader) int64 {
	// Hidden behind plain Reader and Writer, the connections cannot take
	// the copy over with a buffer of their own.
	n, _ := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, tunnelBuf))
	return n
}

// closeWrite half-closes c when it can, else closes it.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		return
	}
	_ = c.Close()
}

// handleHTTP decides a plain-HTTP proxy request: refused with 403 and an
// event (a protocol upgrade too), or sent on to goproxy's transport with the
// checked address, in the context of the run's connection (connCtx).
func (s *Session) handleHTTP(req *http.Request, ctx *goproxy.ProxyCtx) (*http.Request, *http.Response) {
	if m, ok := ctx.UserData.(*mitmTarget); ok {
		return s.handleInjected(req, ctx, m)
	}
	ev := messages.EgressEvent{Time: time.Now().UTC(), Method: req.Method}
	refuse := func(reason string) (*http.Request, *http.Response) {
		ev.Reason = reason
		s.record(ev)
		return req, goproxy.NewResponse(req, "text/plain", http.StatusForbidden, "jetcrew egress: refused: "+reason+"\n")
	}
	if req.URL.Scheme != "http" {
		ev.Host = req.URL.Host
		return refuse(fmt.Sprintf("scheme %q: only plain http is forwarded; use CONNECT for TLS", req.URL.Scheme))
	}
	host, port, err := splitHostPort(req.URL.Host, 80)
	if err != nil {
		ev.Host = req.URL.Host
		return refuse(err.Error())
	}
	ev.Port = port
	if req.Header.Get("Upgrade") != "" {
		// goproxy's relay of an upgraded connection (WebSocket) never
		// closes the run's side and skips the response hooks that record
		// the attempt; wss:// goes through CONNECT like any TLS.
		ev.Host = normalizeHost(host)
		return refuse(fmt.Sprintf("protocol upgrade (Upgrade: %q) over plain HTTP is not forwarded; use TLS through CONNECT (wss://)", req.Header.Get("Upgrade")))
	}
	var target netip.AddrPort
	var reason string
	ev.Host, target, reason = s.decide(connCtx(req), host, port, &ev)
	if reason == "" {
		reason = s.meteredAddr(connCtx(req), target)
	}
	if reason != "" {
		return refuse(reason)
	}
	s.begin()
	ev.Allowed, ev.Addr = true, target.String()
	a := &attempt{ev: ev}
	if req.Body != nil {
		a.up = &countingReader{r: req.Body}
		req.Body = a.up
	}
	ctx.UserData = a
	return req.WithContext(context.WithValue(connCtx(req), dialKey{}, target)), nil
}

// handleResponse counts an allowed plain-HTTP response's body and records
// the attempt when the body is closed (or at once when the request failed).
func (s *Session) handleResponse(resp *http.Response, ctx *goproxy.ProxyCtx) *http.Response {
	a, ok := ctx.UserData.(*attempt)
	if !ok {
		return resp
	}
	if resp == nil {
		return s.upstreamFailed(a, ctx)
	}
	if a.model != nil {
		s.wrapModel(a.model, resp)
	}
	cr := &countingReader{r: resp.Body}
	resp.Body = &closeHook{countingReader: cr, close: func() { s.finishAttempt(a, cr.n.Load(), "") }}
	return resp
}

// upstreamFailed records a, a plain-HTTP request whose host could not be
// reached or did not answer (ctx.Error), with the cause, and returns the
// proxy's own answer to it: 502 naming the cause (nil when the run's
// connection ended first: no one to answer).
func (s *Session) upstreamFailed(a *attempt, ctx *goproxy.ProxyCtx) *http.Response {
	err := ctx.Error
	if err == nil {
		err = errors.New("no answer")
	}
	cause, final := s.upstreamFailure(connCtx(ctx.Req), err)
	s.finishAttempt(a, 0, cause)
	if a.model != nil {
		s.endModel(a.model, usage.Result{})
	}
	if cause == "" {
		return nil
	}
	return upstreamAnswer(ctx.Req, "", net.JoinHostPort(a.ev.Host, strconv.Itoa(a.ev.Port)), cause, final)
}

// finishAttempt records an allowed plain-HTTP (or injected) request once,
// with the bytes received, and ends it (begin).
func (s *Session) finishAttempt(a *attempt, down int64, reason string) {
	a.once.Do(func() {
		if a.up != nil {
			a.ev.BytesUp = a.up.n.Load()
		}
		a.ev.BytesDown, a.ev.Reason = down, reason
		s.record(a.ev)
		s.end()
	})
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.ReadCloser
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }

// closeHook calls close once the body is closed.
type closeHook struct {
	*countingReader
	close func()
}

func (c *closeHook) Close() error {
	err := c.countingReader.Close()
	c.close()
	return err
}
