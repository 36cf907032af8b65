package worker_test

import (
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
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// loopbackResolver resolves every name to 127.0.0.1.
type loopbackResolver struct{}

func (loopbackResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

// runDir returns the host directory a fake container mounts as its run
// directory.
func runDir(spec jail.ContainerSpec) string {
	for _, m := range spec.Mounts {
		if m.Target == messages.ContainerRunDir {
			return m.Source
		}
	}
	return ""
}

// egressClient is an HTTP client of a fake container whose proxy is its
// egress socket, trusting the egress CA staged in its run directory (nil
// roots when none is).
func egressClient(dir string) *http.Client {
	roots := x509.NewCertPool()
	if pem, err := os.ReadFile(filepath.Join(dir, profile.EgressCAName)); err == nil {
		roots.AppendCertsFromPEM(pem)
	}
	return &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy:3128"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Join(dir, profile.EgressSocketName))
		},
		TLSClientConfig: &tls.Config{RootCAs: roots},
	}}
}

// egressProofBehaviour passes the worker's egress proof in a fake
// container: one attempt through the socket, refused.
func egressProofBehaviour(ctx context.Context, spec jail.ContainerSpec, _ jail.OutputFunc) jail.ExitStatus {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://outside.invalid/", nil)
	resp, err := egressClient(runDir(spec)).Do(req)
	if err != nil || resp.StatusCode != http.StatusForbidden {
		return jail.ExitStatus{Code: 1}
	}
	resp.Body.Close()
	return jail.ExitStatus{}
}

// modelRequests sends n model requests to u through the container's egress
// proxy, one after the other, and prints "R<i> <status>" after each.
func modelRequests(u string, n int) workertest.Behaviour {
	return func(ctx context.Context, spec jail.ContainerSpec, out jail.OutputFunc) jail.ExitStatus {
		c := egressClient(runDir(spec))
		for i := 1; i <= n; i++ {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(`{"model":"claude-test","max_tokens":8}`))
			resp, err := c.Do(req)
			if err != nil {
				out("stdout", fmt.Appendf(nil, "R%d error %v\n", i, err))
				return jail.ExitStatus{Code: 1}
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			out("stdout", fmt.Appendf(nil, "R%d %d\n", i, resp.StatusCode))
		}
		return jail.ExitStatus{}
	}
}

// A run paused at its budget (on_budget = "pause") is not stopped as
// stalled while its request is held, however long the pause beside its
// stall_timeout: a grant then lets it go on, and it succeeds. Before, the
// stall watchdog ended it "stalled" one stall_timeout into the pause, and
// a grant after that was lost.
func TestPausedRunNotStalled(t *testing.T) {
	t.Parallel()
	prov := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"type":"message","model":"claude-test","usage":{"input_tokens":10,"output_tokens":7}}`)
	}))
	t.Cleanup(prov.Close)
	port := prov.Listener.Addr().(*net.TCPAddr).Port
	const stall = 500 * time.Millisecond
	profiles, err := profile.ParseProfiles("t", fmt.Appendf(nil, `[profiles.paused]
image = "img"
command = ["/bin/sh", "-c", "{prompt}"]
coordination = false
stall_timeout = %[2]q
egress = ["example.com:%[1]d", "127.0.0.1:%[1]d"]
egress_inject = [{ host = "example.com:%[1]d", header = "x-api-key", from_env = "K" }]
max_model_requests = 1
on_budget = "pause"
budget_pause = "1m"
`, port, stall.String()))
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(prov.Certificate())
	b := setup(t, func(c *worker.Config) {
		c.Profiles, c.EgressResolver, c.EgressUpstreamRoots, c.EgressCADir = profiles, loopbackResolver{}, roots, t.TempDir()
		c.LookupEnv = func(k string) (string, bool) { return "sk-worker", k == "K" }
		c.Runtime.(*workertest.Runtime).Behave = func(spec jail.ContainerSpec) (workertest.Behaviour, error) {
			if spec.Labels[jail.LabelRole] == jail.RoleEgressProof {
				return egressProofBehaviour, nil
			}
			return modelRequests(fmt.Sprintf("https://example.com:%d/v1/messages", port), 2), nil
		}
	})
	require.Eventually(t, b.w.Ready, 10*time.Second, 10*time.Millisecond, "the egress proof never passed")
	b.submit(t, messages.RunRequest{ID: "paused-1", Profile: "paused", Prompt: "x"})

	// Poll until the run has been held for several stall timeouts: it
	// must still be running.
	var pausedAt time.Time
	for deadline := time.Now().Add(20 * time.Second); pausedAt.IsZero() || time.Since(pausedAt) < 6*stall; time.Sleep(20 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "the run never paused")
		st, ok := b.state(t, "paused-1")
		require.False(t, ok && st.State.Final(), "the run ended while paused: %s (%s)", st.State, st.Reason)
		if ok && strings.HasPrefix(st.Budget, "paused: ") && pausedAt.IsZero() {
			pausedAt = time.Now()
		}
	}

	d, err := dispatcher.New(b.nc)
	require.NoError(t, err)
	_, err = d.Grant(context.Background(), messages.BudgetScopeRun, "paused-1", messages.BudgetSpend{Requests: 1})
	require.NoError(t, err)
	st := b.waitFinal(t, "paused-1")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.EqualValues(t, 2, st.Usage.Requests)
	require.Empty(t, st.Budget)
}
