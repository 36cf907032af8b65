//go:build bench

package bench

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/egress/policy"
)

// Sizes of the in-process egress benchmark.
const (
	egressSamples = 400 // TTFB samples per round and side
	egressRounds  = 4   // alternating rounds
	egressTunnels = 200 // open tunnels per memory round
)

type loopResolver struct{}

func (loopResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

// egressBench is a loopback TLS server answering 1 KiB and an egress proxy
// session allowed to reach it as api.bench.test.
type egressBench struct {
	port string // the server's port
	sock string // the session's socket
}

// client returns an HTTP client without keep-alives, direct or through
// the session.
func (b egressBench) client(proxied bool) *http.Client {
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}
	if proxied {
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy:3128"})
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", b.sock)
		}
	}
	return &http.Client{Transport: tr}
}

// ttfb returns egressSamples times to first byte, in ms, of GETs of u.
func (b egressBench) ttfb(t *testing.T, c *http.Client, u string) []float64 {
	var ds []float64
	for i := 0; i < egressSamples; i++ {
		var first time.Time
		start := time.Now()
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotFirstResponseByte: func() { first = time.Now() }}))
		resp, err := c.Do(req)
		require.NoError(t, err)
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.EqualValues(t, 1024, n)
		ds = append(ds, float64(first.Sub(start).Microseconds())/1000)
	}
	return ds
}

// memPerTunnel opens egressTunnels idle TLS connections (direct, or through
// the session) and returns the process's heap+stack growth per connection,
// in KiB. It first waits for the previous round's goroutines (baseG) to end.
func (b egressBench) memPerTunnel(t *testing.T, proxied bool, baseG int) float64 {
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); runtime.NumGoroutine() > baseG && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < egressTunnels; i++ {
		name, raw := "127.0.0.1", net.Conn(nil)
		var err error
		if proxied {
			name = "api.bench.test"
			raw, err = net.Dial("unix", b.sock)
			require.NoError(t, err)
			fmt.Fprintf(raw, "CONNECT %s:%s HTTP/1.1\r\nHost: x\r\n\r\n", name, b.port)
			resp, err := http.ReadResponse(bufio.NewReader(raw), &http.Request{Method: http.MethodConnect})
			require.NoError(t, err)
			require.Equal(t, 200, resp.StatusCode)
		} else {
			raw, err = net.Dial("tcp", "127.0.0.1:"+b.port)
			require.NoError(t, err)
		}
		tc := tls.Client(raw, &tls.Config{ServerName: name, InsecureSkipVerify: true})
		require.NoError(t, tc.Handshake())
		conns = append(conns, tc)
	}
	time.Sleep(200 * time.Millisecond)
	runtime.GC()
	runtime.ReadMemStats(&after)
	return float64(int64(after.HeapInuse+after.StackInuse)-int64(before.HeapInuse+before.StackInuse)) / egressTunnels / 1024
}

// TestEgressProxy measures the egress proxy against a direct connection to
// the same loopback TLS server in the same run: time to first byte of a 1
// KiB response on a fresh connection (TCP, CONNECT when proxied, TLS, GET),
// p50 over alternating rounds; and the proxy's memory per open tunnel
// (growth with idle TLS connections through the proxy minus the same with
// direct ones). The in-container relay hop is in TestEgressProxyDocker.
func TestEgressProxy(t *testing.T) {
	body := strings.Repeat("x", 1024)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, body) }))
	defer srv.Close()
	pu, _ := url.Parse(srv.URL)
	b := egressBench{port: pu.Port(), sock: filepath.Join(t.TempDir(), "egress.sock")}
	sess, err := egress.Open(egress.Config{Resolver: loopResolver{}, MaxConns: 4 * egressTunnels, MaxEvents: 1},
		"bench", policy.Must("api.bench.test:"+b.port, "127.0.0.1:"+b.port), b.sock)
	require.NoError(t, err)
	defer sess.Close()

	var direct, proxied []float64
	for r := 0; r < egressRounds; r++ {
		direct = append(direct, b.ttfb(t, b.client(false), "https://127.0.0.1:"+b.port+"/")...)
		proxied = append(proxied, b.ttfb(t, b.client(true), "https://api.bench.test:"+b.port+"/")...)
	}
	d50, p50 := median(direct), median(proxied)
	record(t, "egress_ttfb_direct_p50", Figure{Value: d50, Unit: "ms", Samples: len(direct), What: "time to first byte, 1 KiB over a fresh TLS connection to a loopback server, direct"})
	record(t, "egress_ttfb_proxied_p50", Figure{Value: p50, Unit: "ms", Samples: len(proxied), Baseline: "egress_ttfb_direct_p50", Ratio: p50 / d50,
		What: "the same through the run's egress proxy (unix socket, CONNECT, SNI check, tunnel)"})

	baseG := runtime.NumGoroutine()
	var mds, mps []float64
	for r := 0; r < 3; r++ {
		mds = append(mds, b.memPerTunnel(t, false, baseG))
		mps = append(mps, b.memPerTunnel(t, true, baseG))
	}
	record(t, "egress_mem_per_tunnel", Figure{Value: median(mps) - median(mds), Unit: "KiB", Samples: 3 * egressTunnels,
		What: "heap+stack of the egress proxy per open idle TLS tunnel (median proxied minus median direct, same client and server, 3 rounds each)"})
}
