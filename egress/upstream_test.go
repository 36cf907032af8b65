package egress

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/policy"
	"github.com/jetcrew/jetcrew/messages"
)

// upstreamBundle is a session injecting a key for example.com:port
// (resolved to 127.0.0.1), whatever listens there, and a client of the run
// trusting the session's CA.
type upstreamBundle struct {
	*bundle
	url    string
	client *http.Client
}

// upstreamSetup opens the session of upstreamBundle for port, trusting
// roots for the host's certificate, with cfg's changes mods.
func upstreamSetup(t *testing.T, port int, roots *x509.CertPool, mods ...func(*Config)) *upstreamBundle {
	t.Helper()
	ca, caPEM, err := LoadOrCreateCA(t.TempDir(), "test CA")
	require.NoError(t, err)
	p := strconv.Itoa(port)
	ub := &upstreamBundle{bundle: &bundle{path: filepath.Join(t.TempDir(), "egress.sock")}, url: "https://example.com:" + p}
	cfg := Config{Resolver: table{"example.com": {netip.MustParseAddr("127.0.0.1")}}, CA: ca, UpstreamRoots: roots,
		Publish: func(ev messages.EgressEvent) {
			ub.bundle.mu.Lock()
			ub.bundle.events = append(ub.bundle.events, ev)
			ub.bundle.mu.Unlock()
		}}
	for _, mod := range mods {
		mod(&cfg)
	}
	sess, err := Open(cfg, "run1", policy.Must("example.com:"+p, "127.0.0.1:"+p), ub.path,
		Injection{Name: "example.com", Port: port, Header: "x-api-key", Value: "sk-secret"})
	require.NoError(t, err)
	t.Cleanup(func() { sess.Close() })
	ub.sess = sess
	ub.client = ub.bundle.client()
	trust := x509.NewCertPool()
	require.True(t, trust.AppendCertsFromPEM(caPEM))
	ub.client.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: trust}
	ub.client.Timeout = 10 * time.Second
	return ub
}

// postMessages sends an Anthropic Messages request and returns the answer
// and its whole body.
func (ub *upstreamBundle) postMessages(t *testing.T) (*http.Response, string) {
	t.Helper()
	resp, err := ub.client.Post(ub.url+"/v1/messages", "application/json",
		strings.NewReader(`{"model":"claude-test","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err, "the proxy must answer, not close the connection")
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(body)
}

// anthropicMessage decodes Anthropic's error shape and returns its type and
// message.
func anthropicMessage(t *testing.T, body string) (string, string) {
	t.Helper()
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	require.Equal(t, "error", e.Type, body)
	return e.Error.Type, e.Error.Message
}

// freePort returns a loopback TCP port nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return p
}

// listenWith serves each connection to a loopback listener with serve, and
// returns its port.
func listenWith(t *testing.T, serve func(net.Conn)) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// A model request the proxy cannot take to its metered host is answered,
// never cut: 502 in the provider's own error shape, naming the cause, for a
// host whose certificate the worker does not trust (not retried: a retry
// meets the same certificate), that refuses the connection, that resets it,
// or that does not finish its TLS handshake in time. The attempt's event
// says the same, and the session counts it among its upstream failures.
func TestUpstreamFailureAnswered(t *testing.T) {
	t.Parallel()
	untrusted := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		t.Error("a host whose certificate is not trusted was sent the request")
	}))
	t.Cleanup(untrusted.Close)
	reset := listenWith(t, func(c net.Conn) {
		_, _ = c.Read(make([]byte, 512)) // the ClientHello
		_ = c.(*net.TCPConn).SetLinger(0)
		_ = c.Close()
	})
	silent := listenWith(t, func(c net.Conn) {
		t.Cleanup(func() { _ = c.Close() })
		_, _ = io.Copy(io.Discard, c)
	})
	short := func(c *Config) { c.DialTimeout = 300 * time.Millisecond }
	for _, tc := range []struct {
		name  string
		port  int
		mods  []func(*Config)
		cause string
		retry bool
	}{
		{"certificate not trusted", atoi(t, port(t, untrusted.URL)), nil,
			"upstream certificate not trusted: x509: certificate signed by unknown authority", false},
		{"refused", freePort(t), nil, "upstream refused the connection", true},
		{"reset", reset, nil, "upstream reset the connection", true},
		{"handshake timed out", silent, []func(*Config){short}, "upstream timed out", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ub := upstreamSetup(t, tc.port, x509.NewCertPool(), tc.mods...)
			resp, body := ub.postMessages(t)
			require.Equal(t, http.StatusBadGateway, resp.StatusCode, body)
			require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			typ, msg := anthropicMessage(t, body)
			require.Equal(t, "api_error", typ)
			require.Contains(t, msg, tc.cause)
			require.True(t, strings.HasPrefix(msg, "jetcrew egress: "), msg)
			require.Contains(t, msg, fmt.Sprintf("example.com:%d", tc.port))
			require.NotContains(t, body, "sk-secret")
			if tc.retry {
				require.Empty(t, resp.Header.Get("X-Should-Retry"))
			} else {
				require.Equal(t, "false", resp.Header.Get("X-Should-Retry"))
			}
			ub.eventually(t, func(ev messages.EgressEvent) bool {
				return ev.Allowed && ev.Host == "example.com" && strings.Contains(ev.Reason, tc.cause)
			})
			require.EqualValues(t, 1, ub.sess.Totals().UpstreamFailed)
		})
	}
}

// A plain-HTTP request whose host refuses the connection is answered 502,
// naming the cause, and counted as an upstream failure.
func TestUpstreamFailurePlainHTTP(t *testing.T) {
	t.Parallel()
	p := strconv.Itoa(freePort(t))
	b := setup(t, table{"api.test": {netip.MustParseAddr("127.0.0.1")}}, "api.test:"+p, "127.0.0.1:"+p)
	resp, err := b.client().Get("http://api.test:" + p + "/")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusBadGateway, resp.StatusCode, string(body))
	require.Equal(t, "jetcrew egress: api.test:"+p+": upstream refused the connection\n", string(body))
	b.eventually(t, func(ev messages.EgressEvent) bool {
		return ev.Allowed && strings.Contains(ev.Reason, "upstream refused the connection")
	})
	require.EqualValues(t, 1, b.sess.Totals().UpstreamFailed)
}

// A request cut by the proxy itself (Kill, as a crash would; Close) has
// not met an upstream failure: the attempt is recorded without a reason
// and not counted as one.
func TestUpstreamCutByProxyNotAFailure(t *testing.T) {
	t.Parallel()
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		arrived <- struct{}{}
		<-release
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	ub := upstreamSetup(t, atoi(t, port(t, srv.URL)), roots)
	errc := make(chan error, 1)
	go func() {
		resp, err := ub.client.Post(ub.url+"/v1/messages", "application/json", strings.NewReader(`{"model":"m"}`))
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-arrived
	ub.sess.Kill()
	require.Error(t, <-errc)
	ub.eventually(t, func(ev messages.EgressEvent) bool { return ev.Allowed && ev.Host == "example.com" })
	for _, ev := range ub.recorded() {
		require.Empty(t, ev.Reason, "%+v", ev)
	}
	require.Zero(t, ub.sess.Totals().UpstreamFailed)
}
