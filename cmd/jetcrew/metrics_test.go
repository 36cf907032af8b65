package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// running is a jetcrew command running in the background until stop.
type running struct {
	app  *testApp
	stop func() int // cancels the command and returns its exit code
}

// runInBackground runs args in a fresh app until the test ends or stop is
// called.
func runInBackground(t *testing.T, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a := newTestApp(nil, workertest.NewTestRuntime(t))
	done := make(chan int, 1)
	go func() { done <- a.run(ctx, args) }()
	code, stopped := -1, false
	stop := func() int {
		if stopped {
			return code
		}
		stopped = true
		cancel()
		select {
		case code = <-done:
		case <-time.After(20 * time.Second):
			t.Errorf("%s did not stop; stderr: %s", args[0], a.stderr.String())
		}
		return code
	}
	t.Cleanup(func() { stop() })
	return &running{app: a, stop: stop}
}

var metricsAddrLog = regexp.MustCompile(`"addr":"(127\.0\.0\.1:\d+)"[^\n]*"message":"serving /metrics, /healthz and /readyz"`)

// metricsBase waits for the command's log line naming the metrics address
// and returns the server's base URL.
func (r *running) metricsBase(t *testing.T) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if m := metricsAddrLog.FindStringSubmatch(r.app.stderr.String()); m != nil {
			return "http://" + m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no metrics address logged; stderr: %s", r.app.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// `worker --metrics-addr` serves the worker's metrics, liveness and
// readiness while it runs, and stops serving when it stops.
func TestWorkerMetricsAddr(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	w := runInBackground(t, "worker", "--nats", s.ClientURL(), "--id", "mw", "--metrics-addr", "127.0.0.1:0")
	base := w.metricsBase(t)

	code, body := httpGet(t, base+"/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)
	require.Eventually(t, func() bool {
		code, _ := httpGet(t, base+"/readyz")
		return code == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond)

	code, _, stderr := cli(t, s.ClientURL(), "submit", "--wait", "out hi")
	require.Equal(t, 0, code, "stderr: %s", stderr)
	// The run's slot is freed just after its finished event: poll.
	require.Eventually(t, func() bool {
		_, body := httpGet(t, base+"/metrics")
		return strings.Contains(body, `jetcrew_runs_in_flight{pool="default",worker="mw"} 0`)
	}, 10*time.Second, 20*time.Millisecond)
	code, body = httpGet(t, base+"/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, want := range []string{
		`jetcrew_runs_started_total{pool="default",worker="mw"} 1`,
		`jetcrew_runs_finished_total{pool="default",state="succeeded",worker="mw"} 1`,
		`jetcrew_runs_in_flight{pool="default",worker="mw"} 0`,
		"\ngo_goroutines ",
		"\nprocess_resident_memory_bytes ",
	} {
		require.Contains(t, body, want)
	}

	require.Equal(t, 0, w.stop(), "stderr: %s", w.app.stderr.String())
	_, err := http.Get(base + "/healthz")
	require.Error(t, err, "the metrics server must be shut down with the worker")
}

// `up --metrics-addr` serves the same handler for its embedded worker.
func TestUpMetricsAddr(t *testing.T) {
	t.Parallel()
	up := runInBackground(t, "up", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--metrics-addr", "127.0.0.1:0")
	base := up.metricsBase(t)
	require.Eventually(t, func() bool {
		code, _ := httpGet(t, base+"/readyz")
		return code == http.StatusOK
	}, 15*time.Second, 20*time.Millisecond, "stderr: %s", up.app.stderr.String())
	_, body := httpGet(t, base+"/metrics")
	require.Contains(t, body, "jetcrew_runs_in_flight{")
	require.Equal(t, 0, up.stop(), "stderr: %s", up.app.stderr.String())
}

// Without --metrics-addr nothing is served.
func TestMetricsOffByDefault(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	w := runInBackground(t, "worker", "--nats", s.ClientURL())
	require.Eventually(t, func() bool {
		return strings.Contains(w.app.stderr.String(), `"message":"worker ready"`)
	}, 15*time.Second, 20*time.Millisecond, "stderr: %s", w.app.stderr.String())
	require.NotContains(t, w.app.stderr.String(), "serving /metrics")
	require.Equal(t, 0, w.stop(), "stderr: %s", w.app.stderr.String())
}

// A busy metrics address stops the worker before it takes any run: its
// pool's consumer is never created.
func TestMetricsAddrInUse(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	s := workertest.StartServer(t)

	a := newTestApp(nil, workertest.NewTestRuntime(t))
	code := a.run(t.Context(), []string{"worker", "--nats", s.ClientURL(), "--metrics-addr", l.Addr().String()})
	require.Equal(t, exitFailure, code)
	require.Contains(t, a.stderr.String(), "--metrics-addr")
	require.Contains(t, a.stderr.String(), "address already in use")

	js, err := jetstream.New(workertest.Connect(t, s))
	require.NoError(t, err)
	_, err = js.Consumer(t.Context(), messages.StreamRuns, messages.ConsumerName(messages.DefaultPool))
	require.Error(t, err)
}

func TestScaleOutUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"metrics addr without port", []string{"worker", "--metrics-addr", "127.0.0.1"}, "--metrics-addr"},
		{"metrics addr bad port", []string{"up", "--metrics-addr", "127.0.0.1:http"}, "port must be a number"},
		{"metrics addr port too big", []string{"worker", "--metrics-addr", ":70000"}, "port must be a number"},
		{"replicas too many", []string{"worker", "--replicas", "7"}, "--replicas 7: must be from 1 to 5"},
		{"replicas negative", []string{"worker", "--replicas", "-1"}, "--replicas -1"},
		{"replicas on up", []string{"up", "--replicas", "3"}, "unknown flag: --replicas"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := cli(t, "nats://127.0.0.1:1", tt.args...)
			require.Equal(t, exitUsage, code, "stderr: %s", stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tt.want)
			require.NotContains(t, stderr, "connect to NATS")
		})
	}
}

// `worker --replicas 3` on a three-node JetStream cluster creates every
// stream, bucket and the pool consumer with three replicas, and runs go
// through it.
func TestWorkerReplicasOnCluster(t *testing.T) {
	t.Parallel()
	c := workertest.StartCluster(t, 3)
	w := runInBackground(t, "worker", "--nats", c.URLs(), "--replicas", "3", "--metrics-addr", "127.0.0.1:0")
	base := w.metricsBase(t)
	require.Eventually(t, func() bool {
		code, _ := httpGet(t, base+"/readyz")
		return code == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond, "stderr: %s", w.app.stderr.String())

	nc, err := nats.Connect(c.URLs())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	for _, name := range []string{messages.StreamRuns, messages.StreamEvents, messages.StreamFailed, "KV_" + messages.BucketRuns} {
		st, err := js.Stream(t.Context(), name)
		require.NoError(t, err, name)
		require.Equal(t, 3, st.CachedInfo().Config.Replicas, name)
	}
	require.Equal(t, 3, consumerInfo(t, nc).Config.Replicas)

	code, stdout, stderr := cli(t, strings.Split(c.URLs(), ",")[2], "submit", "--wait", "out replicated")
	require.Equal(t, 0, code, "stderr: %s", stderr)
	require.Equal(t, "replicated\n", stdout)
	require.Equal(t, 0, w.stop(), "stderr: %s", w.app.stderr.String())
}
