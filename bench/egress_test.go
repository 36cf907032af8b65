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
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress"
)

type loopResolver struct{}

func (loopResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

// TestEgressProxy measures the egress proxy against a direct connection to
// the same loopback TLS server in the same run: time to first byte of a 1
// KiB response on a fresh connection (TCP, CONNECT when proxied, TLS, GET),
// p50 of egressSamples; and the proxy's memory per open tunnel (heap and
// stacks of the process with egressTunnels idle TLS connections open through
// the proxy, minus the same with direct connections, per connection). The
// in-container relay hop is not included.
func TestEgressProxy(t *testing.T) {
	const egressSamples, egressTunnels = 400, 200
	body := strings.Repeat("x", 1024)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, body) }))
	defer srv.Close()
	pu, _ := url.Parse(srv.URL)
	sock := filepath.Join(t.TempDir(), "egress.sock")
	sess, err := egress.Open(egress.Config{Resolver: loopResolver{}, MaxOpen: 4 * egressTunnels, MaxEvents: 1},
		"bench", egress.MustPolicy("api.bench.test:"+pu.Port(), "127.0.0.1:"+pu.Port()), sock)
	require.NoError(t, err)
	defer sess.Close()

	client := func(proxied bool) *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}
		if proxied {
			tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy:3128"})
			tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", sock)
			}
		}
		return &http.Client{Transport: tr}
	}
	ttfb := func(c *http.Client, u string) []float64 {
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
		sort.Float64s(ds)
		return ds
	}
	// Interleave the two so load on the machine hits both alike.
	var direct, proxied []float64
	for r := 0; r < 4; r++ {
		direct = append(direct, ttfb(client(false), "https://127.0.0.1:"+pu.Port()+"/")...)
		proxied = append(proxied, ttfb(client(true), "https://api.bench.test:"+pu.Port()+"/")...)
	}
	sort.Float64s(direct)
	sort.Float64s(proxied)
	d50, p50 := direct[len(direct)/2], proxied[len(proxied)/2]
	record(t, "egress_ttfb_direct_p50", Figure{Value: d50, Unit: "ms", Samples: len(direct), What: "time to first byte, 1 KiB over a fresh TLS connection to a loopback server, direct"})
	record(t, "egress_ttfb_proxied_p50", Figure{Value: p50, Unit: "ms", Samples: len(proxied), Baseline: "egress_ttfb_direct_p50", Ratio: p50 / d50,
		What: "the same through the run's egress proxy (unix socket, CONNECT, SNI check, tunnel)"})

	baseG := runtime.NumGoroutine()
	mem := func(proxied bool) float64 {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		// The previous round's connections end asynchronously: wait for
		// their goroutines before taking the baseline.
		for deadline := time.Now().Add(10 * time.Second); runtime.NumGoroutine() > baseG && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		g0 := runtime.NumGoroutine()
		for i := 0; i < egressTunnels; i++ {
			var raw net.Conn
			var err error
			name := "127.0.0.1"
			if proxied {
				name = "api.bench.test"
				raw, err = net.Dial("unix", sock)
				require.NoError(t, err)
				fmt.Fprintf(raw, "CONNECT %s:%s HTTP/1.1\r\nHost: x\r\n\r\n", name, pu.Port())
				br := bufio.NewReader(raw)
				resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
				require.NoError(t, err)
				require.Equal(t, 200, resp.StatusCode)
			} else {
				raw, err = net.Dial("tcp", "127.0.0.1:"+pu.Port())
				require.NoError(t, err)
			}
			tc := tls.Client(raw, &tls.Config{ServerName: name, InsecureSkipVerify: true})
			require.NoError(t, tc.Handshake())
			conns = append(conns, tc)
		}
		time.Sleep(200 * time.Millisecond)
		runtime.GC()
		runtime.ReadMemStats(&after)
		t.Logf("proxied=%v heap/tunnel=%.1f KiB stack/tunnel=%.1f KiB goroutines/tunnel=%.2f", proxied,
			float64(int64(after.HeapInuse)-int64(before.HeapInuse))/egressTunnels/1024,
			float64(int64(after.StackInuse)-int64(before.StackInuse))/egressTunnels/1024,
			float64(runtime.NumGoroutine()-g0)/egressTunnels)
		return float64(int64(after.HeapInuse+after.StackInuse)-int64(before.HeapInuse+before.StackInuse)) / egressTunnels
	}
	// Alternate, three of each; the figure is the difference of medians.
	var mds, mps []float64
	for r := 0; r < 3; r++ {
		mds = append(mds, mem(false)/1024)
		mps = append(mps, mem(true)/1024)
	}
	md, mp := median(mds), median(mps)
	record(t, "egress_mem_per_tunnel", Figure{Value: mp - md, Unit: "KiB", Samples: 3 * egressTunnels,
		What: "heap+stack of the egress proxy per open idle TLS tunnel (median proxied minus median direct, same client and server, 3 rounds each)"})
}
