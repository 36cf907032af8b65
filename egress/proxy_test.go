package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/policy"
	"github.com/jetcrew/jetcrew/messages"
)

// table is a Resolver with fixed answers.
type table map[string][]netip.Addr

// LookupNetIP answers from the table, and fails as a real resolver does
// when ctx has ended.
func (t table) LookupNetIP(ctx context.Context, _, host string) ([]netip.Addr, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if a, ok := t[host]; ok {
		return a, nil
	}
	return nil, fmt.Errorf("no such host %s", host)
}

type bundle struct {
	sess   *Session
	path   string
	mu     sync.Mutex
	events []messages.EgressEvent
}

func (b *bundle) recorded() []messages.EgressEvent {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]messages.EgressEvent(nil), b.events...)
}

func setup(t *testing.T, res table, entries ...string) *bundle {
	t.Helper()
	b := &bundle{path: filepath.Join(t.TempDir(), "egress.sock")}
	cfg := Config{Resolver: res, RestartDelay: 50 * time.Millisecond, Publish: func(ev messages.EgressEvent) {
		b.mu.Lock()
		b.events = append(b.events, ev)
		b.mu.Unlock()
	}}
	s, err := Open(cfg, "run1", policy.Must(entries...), b.path)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	b.sess = s
	return b
}

// client is an HTTP client whose proxy is the session's socket.
func (b *bundle) client() *http.Client {
	d := &net.Dialer{}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		Proxy:             http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy.invalid:3128"}),
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialContext(ctx, "unix", b.path) },
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
		DisableKeepAlives: true,
	}}
}

func port(t *testing.T, u string) string {
	pu, err := url.Parse(u)
	require.NoError(t, err)
	return pu.Port()
}

func TestProxyPolicy(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello from "+r.Host)
	}))
	defer srv.Close()
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "plain") }))
	defer plain.Close()
	p, pp := port(t, srv.URL), port(t, plain.URL)
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	res := table{"api.test": lo, "other.test": lo, "x.wild.test": lo}
	b := setup(t, res, "api.test:"+p, "other.test:"+p, "*.wild.test:"+p, "127.0.0.1:"+p, "api.test:"+pp, "127.0.0.1:"+pp)
	c := b.client()

	get := func(u string) (string, error) {
		resp, err := c.Get(u)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			return "", fmt.Errorf("status %d: %s", resp.StatusCode, body)
		}
		return string(body), nil
	}
	body, err := get("https://api.test:" + p + "/")
	require.NoError(t, err)
	require.Equal(t, "hello from api.test:"+p, body)
	_, err = get("https://x.wild.test:" + p + "/")
	require.NoError(t, err)
	body, err = get("http://api.test:" + pp + "/")
	require.NoError(t, err)
	require.Equal(t, "plain", body)

	for _, tc := range []struct{ url, why string }{
		{"https://unlisted.test:" + p + "/", "not in the profile's egress allowlist"},
		{"https://wild.test:" + p + "/", "not in the profile's egress allowlist"},
		{"https://169.254.169.254:80/", "address literal"},
		{"http://169.254.169.254/latest/meta-data/", "address literal"},
		{"http://unlisted.test:" + pp + "/", "not in the profile's egress allowlist"},
	} {
		_, err := get(tc.url)
		require.Error(t, err, tc.url)
		require.True(t, strings.Contains(err.Error(), "Forbidden") || strings.Contains(err.Error(), "status 403"), tc.url+": "+err.Error())
		require.Eventually(t, func() bool {
			for _, ev := range b.recorded() {
				if !ev.Allowed && strings.Contains(tc.url, ev.Host) && strings.Contains(ev.Reason, tc.why) {
					return true
				}
			}
			return false
		}, 5*time.Second, 10*time.Millisecond, tc.url)
	}
	events := b.recorded()
	require.Eventually(t, func() bool { events = b.recorded(); return len(events) == 8 }, 5*time.Second, 10*time.Millisecond)
	allowed := 0
	for _, ev := range events {
		if ev.Allowed {
			allowed++
			require.Empty(t, ev.Reason)
			if ev.Method == http.MethodConnect {
				require.Positive(t, ev.BytesUp)
			}
			require.Positive(t, ev.BytesDown)
		} else {
			require.NotEmpty(t, ev.Reason)
		}
		require.Equal(t, "run1", ev.RunID)
	}
	require.Equal(t, 3, allowed)
	tot := b.sess.Totals()
	require.EqualValues(t, 3, tot.Allowed)
	require.EqualValues(t, 5, tot.Refused)
}

// TestProxyRefusesPrivateResolution: a listed name that resolves to a
// loopback, private or link-local address is refused unless that address is
// listed too.
func TestProxyRefusesPrivateResolution(t *testing.T) {
	t.Parallel()
	res := table{
		"lo.test":   {netip.MustParseAddr("127.0.0.1")},
		"meta.test": {netip.MustParseAddr("169.254.169.254")},
		"priv.test": {netip.MustParseAddr("10.1.2.3")},
	}
	b := setup(t, res, "lo.test:443", "meta.test:80", "priv.test:443")
	for _, hp := range []struct {
		h    string
		p    int
		want string
	}{{"lo.test", 443, "loopback"}, {"meta.test", 80, "link-local"}, {"priv.test", 443, "private"}} {
		_, _, reason := b.sess.gate.decide(context.Background(), hp.h, hp.p, nil)
		require.Contains(t, reason, hp.want)
	}
}

// TestProxySNIMismatch: a tunnel to an allowed name whose ClientHello names
// another server is cut and recorded refused.
func TestProxySNIMismatch(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	p := port(t, srv.URL)
	b := setup(t, table{"api.test": {netip.MustParseAddr("127.0.0.1")}}, "api.test:"+p, "127.0.0.1:"+p)
	conn, err := net.Dial("unix", b.path)
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "CONNECT api.test:%s HTTP/1.1\r\nHost: api.test:%s\r\n\r\n", p, p)
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, line, "200")
	_, _ = br.ReadString('\n')
	tc := tls.Client(conn, &tls.Config{ServerName: "evil.example", InsecureSkipVerify: true})
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	require.Error(t, tc.Handshake())
	require.Eventually(t, func() bool {
		ev := b.recorded()
		return len(ev) == 1 && !ev[0].Allowed && strings.Contains(ev[0].Reason, "SNI")
	}, 5*time.Second, 10*time.Millisecond)
}

// TestProxyKillRestarts: a killed proxy refuses connections (nothing else
// leads out) until its supervisor brings it back.
func TestProxyKillRestarts(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer srv.Close()
	p := port(t, srv.URL)
	b := setup(t, table{"api.test": {netip.MustParseAddr("127.0.0.1")}}, "api.test:"+p, "127.0.0.1:"+p)
	b.sess.cfg.RestartDelay = time.Second // set before Kill reads it
	c := b.client()
	resp, err := c.Get("http://api.test:" + p + "/")
	require.NoError(t, err)
	resp.Body.Close()
	b.sess.Kill()
	_, err = c.Get("http://api.test:" + p + "/")
	require.Error(t, err, "the proxy is down: the request must fail")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.Eventually(t, func() bool { return b.sess.Restarts() == 1 }, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, b.sess.WaitUp(ctx))
	resp, err = c.Get("http://api.test:" + p + "/")
	require.NoError(t, err)
	resp.Body.Close()
}

// TestProxyInjectsKey: for an injected host the proxy terminates TLS with
// its CA's certificate, sets the header (replacing the request's own), and
// reaches the real host over its own, verified TLS; a request naming another
// host inside that tunnel is refused.
func TestProxyInjectsKey(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var seen [][]string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Values("X-Api-Key"))
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	p := port(t, srv.URL)
	ca, caPEM, err := LoadOrCreateCA(t.TempDir(), "test CA")
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	b := &bundle{path: filepath.Join(t.TempDir(), "egress.sock")}
	// httptest's certificate names example.com: the proxy's upstream TLS
	// verifies that name, so the provider is reached as example.com.
	sess, err := Open(Config{Resolver: table{"example.com": {netip.MustParseAddr("127.0.0.1")}}, CA: ca, UpstreamRoots: roots},
		"run1", policy.Must("example.com:"+p, "127.0.0.1:"+p), b.path,
		Injection{Name: "example.com", Port: atoi(t, p), Header: "x-api-key", Value: "sk-secret"})
	require.NoError(t, err)
	defer sess.Close()
	b.sess = sess
	c := b.client()
	trust := x509.NewCertPool()
	require.True(t, trust.AppendCertsFromPEM(caPEM))
	c.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: trust}

	req, _ := http.NewRequest(http.MethodGet, "https://example.com:"+p+"/", nil)
	req.Header.Set("x-api-key", "sk-fake-from-the-agent")
	resp, err := c.Do(req)
	require.NoError(t, err, "the run trusts the CA's certificate for the injected host")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, "ok", string(body))
	mu.Lock()
	require.Equal(t, [][]string{{"sk-secret"}}, seen, "replaced, not duplicated")
	mu.Unlock()

	// Another Host inside the tunnel: refused, the key goes nowhere.
	req, _ = http.NewRequest(http.MethodGet, "https://example.com:"+p+"/", nil)
	req.Host = "evil.example"
	resp, err = c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	mu.Lock()
	require.Len(t, seen, 1)
	mu.Unlock()
	require.EqualValues(t, 1, sess.Totals().Allowed)

	// The real host down: the attempt is recorded and its slot freed.
	srv.Close()
	if resp, err := c.Get("https://example.com:" + p + "/"); err == nil {
		resp.Body.Close()
	}
	start := time.Now()
	tot := sess.Close()
	// Close waits closeWait (5 s) for a slot never freed; anything under
	// that proves the slot was freed, on however loaded a machine.
	require.Less(t, time.Since(start), closeWait-time.Second, "a connection slot was never freed")
	require.EqualValues(t, 2, tot.Allowed)
}

func atoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}

// The caps a run cannot exceed: open connections (MaxConns: a further one
// gets 429 and a refusal, even while the open one is a tunnel) and published
// events (MaxEvents: later attempts are only counted).
func TestProxyCaps(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	p := port(t, srv.URL)
	b := &bundle{path: filepath.Join(t.TempDir(), "egress.sock")}
	sess, err := Open(Config{Resolver: table{"api.test": {netip.MustParseAddr("127.0.0.1")}}, MaxConns: 1, MaxEvents: 3,
		Publish: func(ev messages.EgressEvent) { b.mu.Lock(); b.events = append(b.events, ev); b.mu.Unlock() }},
		"run1", policy.Must("api.test:"+p, "127.0.0.1:"+p), b.path)
	require.NoError(t, err)
	defer sess.Close()
	b.sess = sess
	connect := func() (net.Conn, string) {
		conn, err := net.Dial("unix", b.path)
		require.NoError(t, err)
		fmt.Fprintf(conn, "CONNECT api.test:%s HTTP/1.1\r\nHost: api.test\r\n\r\n", p)
		line, err := bufio.NewReader(conn).ReadString('\n')
		require.NoError(t, err)
		return conn, line
	}
	held, line := connect()
	require.Contains(t, line, "200")
	second, line := connect()
	second.Close()
	require.Contains(t, line, "429")
	held.Close()
	for i := 0; i < 4; i++ {
		_, err := b.client().Get("https://unlisted.test:" + p + "/")
		require.Error(t, err)
	}
	require.Eventually(t, func() bool {
		tot := sess.Totals()
		return tot.Refused == 6 && tot.EventsDropped == 3 // the held tunnel sent no ClientHello: refused too
	}, 5*time.Second, 10*time.Millisecond, "%+v", sess.Totals())
	require.Len(t, b.recorded(), 3)
}

// Workers racing to create the installation's CA end up with one CA; the
// file is 0600 and a later load returns the same certificate.
func TestLoadOrCreateCARace(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ca")
	certs := make([][]byte, 8)
	var wg sync.WaitGroup
	for i := range certs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, c, err := LoadOrCreateCA(dir, "test CA")
			require.NoError(t, err)
			certs[i] = c
		}()
	}
	wg.Wait()
	for _, c := range certs {
		require.Equal(t, certs[0], c)
	}
	fi, err := os.Stat(filepath.Join(dir, "ca.pem"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	_, again, err := LoadOrCreateCA(dir, "test CA")
	require.NoError(t, err)
	require.Equal(t, certs[0], again)
	require.NotContains(t, string(again), "PRIVATE KEY")
}
