package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/elazarl/goproxy"

	"github.com/jetcrew/jetcrew/egress/usage"
)

// errIdle is the cause a clientConn's context ends with when the idle
// bound (Config.IdleTimeout) closed it.
var errIdle = errors.New("egress: the connection moved no byte for the idle bound")

// upstreamFailure classifies err, the failure of a request or tunnel to a
// host, into the cause the proxy records and answers the run with:
// "upstream certificate not trusted: …", "upstream refused the
// connection", "upstream reset the connection", "upstream timed out: …",
// "upstream closed the connection without an answer", else "upstream
// failed: …". final is true when a retry would meet the same cause (a
// certificate). conn is the context of the run's connection: when it ended
// first for another reason than the idle bound (idle, Config.IdleTimeout:
// the run gave up, or the proxy was killed or closed), nothing failed
// upstream and cause is "".
func upstreamFailure(conn context.Context, err error, idle time.Duration) (cause string, final bool) {
	if conn.Err() != nil {
		if errors.Is(context.Cause(conn), errIdle) {
			return fmt.Sprintf("upstream timed out: no byte either way for %s", idle), false
		}
		return "", false
	}
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		nerr     net.Error
	)
	switch {
	case errors.As(err, &verify):
		return certCause(verify.Err), true
	case errors.As(err, &unknown), errors.As(err, &hostname), errors.As(err, &invalid):
		return certCause(err), true
	case errors.Is(err, syscall.ECONNREFUSED):
		return "upstream refused the connection", false
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "upstream reset the connection", false
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &nerr) && nerr.Timeout():
		return "upstream timed out: " + oneLine(err.Error()), false
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "upstream closed the connection without an answer", false
	}
	return "upstream failed: " + oneLine(err.Error()), false
}

// certCause is the cause of a host certificate the proxy does not trust,
// with the way to make a worker trust its CA.
func certCause(err error) string {
	return "upstream certificate not trusted: " + oneLine(err.Error()) + " (the worker's --egress-ca adds a CA to trust)"
}

// oneLine returns s with its line breaks as spaces.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// upstreamAnswer is the proxy's answer to req, a request to hostport that
// failed upstream with cause: 502 in the provider's own error shape for
// format (usage.UpstreamError; text for none), with "x-should-retry: false"
// when final.
func upstreamAnswer(req *http.Request, format, hostport, cause string, final bool) *http.Response {
	status, ct, body := usage.UpstreamError(format, "jetcrew egress: "+hostport+": "+cause)
	resp := goproxy.NewResponse(req, ct, status, string(body))
	if final {
		resp.Header.Set("X-Should-Retry", "false")
	}
	return resp
}
