//go:build bench

package bench

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
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/egress/policy"
	"github.com/jetcrew/jetcrew/messages"
)

// Sizes of the metering benchmark.
const (
	meterSamples    = 200 // time-to-first-token samples per round and side
	meterRounds     = 4   // alternating rounds
	meterBigRounds  = 11  // 10 MiB streams per side
	meterStreamSize = 10 << 20
)

// sseStandIn is an Anthropic Messages stand-in: POST /v1/messages?big=1
// streams meterStreamSize bytes of content_block_delta events, else one
// short stream; the first token (a content_block_delta) follows
// message_start at once.
func sseStandIn() http.Handler {
	chunk := strings.Repeat("y", 960)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-bench\",\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n")
		fmt.Fprint(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"first\"}}\n\n")
		f.Flush()
		if r.URL.Query().Get("big") != "" {
			line := "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"" + chunk + "\"}}\n\n"
			for sent, i := 0, 0; sent < meterStreamSize; i++ {
				n, _ := io.WriteString(w, line)
				sent += n
				if i%64 == 0 {
					f.Flush()
				}
			}
		}
		fmt.Fprint(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":9}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	})
}

// meterClient is a keep-alive client (as the model SDKs are) through the
// session at sock, trusting roots.
func meterClient(sock string, roots *x509.CertPool) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy:3128"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
		TLSClientConfig: &tls.Config{RootCAs: roots},
	}}
}

// firstToken posts a streamed request and returns the time to the first
// content_block_delta line, in ms, and the bytes of the whole body.
func firstToken(t *testing.T, c *http.Client, u string) (float64, int64) {
	start := time.Now()
	resp, err := c.Post(u, "application/json", strings.NewReader(`{"model":"claude-bench","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	r := bufio.NewReader(resp.Body)
	var first float64
	var n int64
	for {
		line, err := r.ReadString('\n')
		n += int64(len(line))
		if first == 0 && strings.HasPrefix(line, "event: content_block_delta") {
			first = float64(time.Since(start).Microseconds()) / 1000
		}
		if err != nil {
			break
		}
	}
	return first, n
}

// TestMeteringOverhead measures what metering model usage costs a run, in
// the same run against the proxy's blind tunnel to the same loopback TLS
// stand-in (Anthropic Messages, server-sent events): the time to the first
// token of a streamed response (keep-alive clients, as the model SDKs
// are), p50 over alternating rounds; and the time to receive a 10 MiB
// streamed response. The metered side is an egress_inject host: the proxy
// terminates TLS with its CA, sets the key, opens its own TLS connection
// upstream and reads the usage as the stream passes.
func TestMeteringOverhead(t *testing.T) {
	srv := httptest.NewUnstartedServer(sseStandIn())
	srv.StartTLS()
	defer srv.Close()
	pu, _ := url.Parse(srv.URL)
	port := pu.Port()
	upstream := x509.NewCertPool()
	upstream.AddCert(srv.Certificate())
	ca, caPEM, err := egress.LoadOrCreateCA(t.TempDir(), "bench CA")
	require.NoError(t, err)
	trustCA := x509.NewCertPool()
	require.True(t, trustCA.AppendCertsFromPEM(caPEM))

	// httptest's certificate names example.com.
	res := loopResolver{}
	plainSock := filepath.Join(t.TempDir(), "plain.sock")
	plain, err := egress.Open(egress.Config{Resolver: res, MaxEvents: 1}, "bench-plain", policy.Must("example.com:"+port, "127.0.0.1:"+port), plainSock)
	require.NoError(t, err)
	defer plain.Close()
	meteredSock := filepath.Join(t.TempDir(), "metered.sock")
	metered, err := egress.Open(egress.Config{Resolver: res, MaxEvents: 1, CA: ca, UpstreamRoots: upstream}, "bench-metered",
		policy.Must("example.com:"+port, "127.0.0.1:"+port), meteredSock,
		egress.Injection{Name: "example.com", Port: atoiPort(t, port), Header: "x-api-key", Value: "sk-bench"})
	require.NoError(t, err)
	defer metered.Close()
	unmeteredSock := filepath.Join(t.TempDir(), "unmetered.sock")
	unmetered, err := egress.Open(egress.Config{Resolver: res, MaxEvents: 1, CA: ca, UpstreamRoots: upstream, Unmetered: true}, "bench-unmetered",
		policy.Must("example.com:"+port, "127.0.0.1:"+port), unmeteredSock,
		egress.Injection{Name: "example.com", Port: atoiPort(t, port), Header: "x-api-key", Value: "sk-bench"})
	require.NoError(t, err)
	defer unmetered.Close()
	var events atomic.Int64
	metered.Meter(egress.Metering{Observe: func(ev messages.UsageEvent) {
		if ev.Known {
			events.Add(1)
		}
	}})

	u := "https://example.com:" + port + "/v1/messages"
	cPlain, cUnmetered, cMetered := meterClient(plainSock, upstream), meterClient(unmeteredSock, trustCA), meterClient(meteredSock, trustCA)
	// Warm each (a first TLS handshake).
	firstToken(t, cPlain, u)
	firstToken(t, cUnmetered, u)
	firstToken(t, cMetered, u)
	var tun, unm, met []float64
	for r := 0; r < meterRounds; r++ {
		for i := 0; i < meterSamples; i++ {
			d, _ := firstToken(t, cPlain, u)
			tun = append(tun, d)
			d, _ = firstToken(t, cUnmetered, u)
			unm = append(unm, d)
			d, _ = firstToken(t, cMetered, u)
			met = append(met, d)
		}
	}
	t50, u50, m50 := median(tun), median(unm), median(met)
	record(t, "metering_ttft_tunnel_p50", Figure{Value: t50, Unit: "ms", Samples: len(tun),
		What: "time to the first token of a streamed Anthropic Messages response from a loopback TLS stand-in that answers at once, through the egress proxy's blind tunnel (keep-alive client): no key injected"})
	record(t, "metering_ttft_unmetered_p50", Figure{Value: u50, Unit: "ms", Samples: len(unm), Baseline: "metering_ttft_tunnel_p50", Ratio: u50 / t50,
		What: "the same through the key-injecting path with the metering off (egress.Config.Unmetered): TLS terminated with the CA, key set, the proxy's own upstream TLS"})
	record(t, "metering_ttft_metered_p50", Figure{Value: m50, Unit: "ms", Samples: len(met), Baseline: "metering_ttft_unmetered_p50", Ratio: m50 / u50,
		What: "the same with the metering on (the request's model read, the usage read as the stream passes, the budgets checked): the metering's own cost; issue 26's goal ≤ 1.05×"})

	var tb, ub, mb []float64
	big := func(c *http.Client) float64 {
		start := time.Now()
		_, n := firstToken(t, c, u+"?big=1")
		require.Greater(t, n, int64(meterStreamSize))
		return float64(time.Since(start).Microseconds()) / 1000
	}
	for r := 0; r < meterBigRounds; r++ {
		tb = append(tb, big(cPlain))
		ub = append(ub, big(cUnmetered))
		mb = append(mb, big(cMetered))
	}
	tbm, ubm, mbm := median(tb), median(ub), median(mb)
	record(t, "metering_stream_10mib_tunnel_ms", Figure{Value: tbm, Unit: "ms", Samples: len(tb),
		What: "a 10 MiB streamed response (about 10,900 server-sent events) through the blind tunnel, request to last byte"})
	record(t, "metering_stream_10mib_unmetered_ms", Figure{Value: ubm, Unit: "ms", Samples: len(ub), Baseline: "metering_stream_10mib_tunnel_ms", Ratio: ubm / tbm,
		What: "the same through the key-injecting path with the metering off"})
	record(t, "metering_stream_10mib_metered_ms", Figure{Value: mbm, Unit: "ms", Samples: len(mb), Baseline: "metering_stream_10mib_unmetered_ms", Ratio: mbm / ubm,
		What: "the same with the metering on (every event parsed as it passes)"})
	require.EqualValues(t, 1+meterRounds*meterSamples+meterBigRounds, events.Load(), "the metered side read every response's usage")
	require.EqualValues(t, 1+meterRounds*meterSamples+meterBigRounds, metered.Usage().Requests)
}

func atoiPort(t *testing.T, s string) int {
	var n int
	_, err := fmt.Sscan(s, &n)
	require.NoError(t, err)
	return n
}
