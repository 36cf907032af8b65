package egress

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/elazarl/goproxy"

	"github.com/jetcrew/jetcrew/messages"
)

// handleConnect decides a CONNECT: refused with 403 and an event,
// terminated for an injected host (injector.connect), or hijacked into a
// tunnel (tunnels.serve).
func (f *forwarder) handleConnect(hostport string, ctx *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
	ev := messages.EgressEvent{Time: time.Now().UTC(), Method: http.MethodConnect}
	host, port, err := splitHostPort(hostport, 0)
	var target netip.AddrPort
	reason := ""
	if err != nil {
		ev.Host, reason = hostport, err.Error()
	} else {
		ev.Port = port
		ev.Host, target, reason = f.gate.decide(connCtx(ctx.Req), host, port, &ev)
	}
	if reason == "" {
		if in, ok := f.gate.injection(ev.Host, ev.Port); ok {
			return f.inject.connect(ctx, ev, target, in), hostport
		}
		reason = f.gate.meteredAddr(connCtx(ctx.Req), target)
	}
	if reason != "" {
		ctx.Resp = f.events.refuse(ctx.Req, ev, reason)
		return goproxy.RejectConnect, hostport
	}
	return &goproxy.ConnectAction{Action: goproxy.ConnectHijack, Hijack: func(_ *http.Request, client net.Conn, _ *goproxy.ProxyCtx) {
		f.tunnels.serve(client, ev, target)
	}}, hostport
}

// tunnels serves a session's allowed CONNECTs to hosts it does not inject
// a key for: the run's TLS passes through, its SNI checked.
type tunnels struct {
	events       *recorder
	conns        *connSet
	dialTimeout  time.Duration // Config.DialTimeout
	helloTimeout time.Duration // Config.HelloTimeout
	idle         time.Duration // Config.IdleTimeout
}

// serve serves an allowed CONNECT: it answers 200, reads the TLS
// ClientHello and checks that its SNI is the CONNECT name (for a name), dials
// the checked address and copies both ways, then records the attempt.
func (t *tunnels) serve(client net.Conn, ev messages.EgressEvent, target netip.AddrPort) {
	defer client.Close()
	t.events.begin()
	defer t.events.end()
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
	dctx, cancelDial := context.WithTimeout(context.Background(), t.dialTimeout)
	defer cancelDial()
	go func() {
		// Ends with the dial: at the latest when the tunnel returns.
		c, err := (&net.Dialer{}).DialContext(dctx, "tcp", target.String())
		dialc <- dialed{c, err}
	}()
	_ = client.SetReadDeadline(time.Now().Add(t.helloTimeout))
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
		t.events.record(ev)
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
		ev.Reason, _ = upstreamFailure(context.Background(), err, t.idle)
		t.events.record(ev)
		return
	}
	ev.Addr = target.String()
	t.conns.track(up, true)
	defer t.conns.track(up, false)
	defer up.Close()
	n, err := up.Write(hello)
	ev.BytesUp += int64(n)
	if err == nil {
		u, d := pipe(client, up)
		ev.BytesUp += u
		ev.BytesDown += d
	}
	t.events.record(ev)
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
