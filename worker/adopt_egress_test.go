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
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/internal/budgetkv"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// startWith starts worker id on the rig as start does, its Config changed
// by mod.
func (r *adoptRig) startWith(t *testing.T, id string, mod func(*worker.Config)) *worker.Worker {
	t.Helper()
	cfg := worker.Config{StateDir: r.dir, BridgePath: r.bridge, ID: id, Runtime: r.bundle.rt,
		Concurrency: 4, FetchWait: time.Second, Provision: worker.ProvisionConfig{AckWait: 3 * time.Second}}
	mod(&cfg)
	w, err := worker.New(r.bundle.nc, cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	return w
}

// reconnectingClient is an HTTP client of a fake container whose proxy is
// its egress socket, dialled again and again for up to 20s while nothing
// serves it, as the in-jail relay does (coordination/bridgecmd), trusting
// the egress CA staged in its run directory.
func reconnectingClient(dir string) *http.Client {
	roots := x509.NewCertPool()
	if pem, err := os.ReadFile(filepath.Join(dir, profile.EgressCAName)); err == nil {
		roots.AppendCertsFromPEM(pem)
	}
	sock := filepath.Join(dir, profile.EgressSocketName)
	return &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy:3128"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			b := backoff.WithContext(backoff.WithMaxRetries(backoff.NewConstantBackOff(20*time.Millisecond), 1000), ctx)
			return backoff.RetryWithData(func() (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", sock)
			}, b)
		},
		TLSClientConfig: &tls.Config{RootCAs: roots},
	}}
}

// twoPhases sends 3 model requests to u through the container's egress
// proxy, prints "phase 1 done", waits for next, then sends 3 more on new
// connections; each prints "R<i> <status>", or "R<i> error" when its
// connection failed (an agent's client then tries again later).
func twoPhases(u string, next <-chan struct{}) workertest.Behaviour {
	return func(ctx context.Context, spec jail.ContainerSpec, out jail.OutputFunc) jail.ExitStatus {
		i := 0
		phase := func() {
			c := reconnectingClient(runDir(spec))
			defer c.CloseIdleConnections()
			for range 3 {
				i++
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(`{"model":"claude-test","max_tokens":8}`))
				resp, err := c.Do(req)
				if err != nil {
					out("stdout", fmt.Appendf(nil, "R%d error\n", i))
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				out("stdout", fmt.Appendf(nil, "R%d %d\n", i, resp.StatusCode))
			}
		}
		phase()
		out("stdout", []byte("phase 1 done\n"))
		select {
		case <-next:
		case <-ctx.Done():
			return jail.ExitStatus{Code: 1}
		}
		phase()
		return jail.ExitStatus{}
	}
}

// groupSpent sums what the budgets bucket holds for group key g, over its
// windows.
func groupSpent(t *testing.T, b *testBundle, g string) messages.BudgetSpend {
	t.Helper()
	ctx := context.Background()
	kv, err := b.js.KeyValue(ctx, messages.BucketBudgets)
	require.NoError(t, err)
	keys, err := kv.Keys(ctx)
	require.NoError(t, err)
	var sum messages.BudgetSpend
	for _, k := range keys {
		if strings.HasPrefix(k, messages.BudgetScopeGroup+"."+g+".") {
			s, _, err := budgetkv.Get(ctx, kv, k)
			require.NoError(t, err)
			sum = sum.Add(s)
		}
	}
	return sum
}

// TestLeaveAndAdoptEgress: a run metered by its egress proxy goes on under
// its worker's successor. Worker 1 serves 3 model requests (a grant
// raises the run's max_model_requests of 4 to 5 meanwhile) and leaves;
// worker 2 adopts the run, serves its egress socket again, and the run's
// next requests go through it: 2 served, the third refused as past the
// budget, which counts the requests before the adoption and the grant.
// The record's usage is both workers' (5 requests, 1 refused), the run
// ends failed at the budget in its first attempt, its container never
// started again, and the group's shared budget counts each request once
// (5, not 8) with nothing left reserved. With "in flight", worker 1
// leaves while the provider holds its third answer: the request is cut,
// counted (its usage unknown) and in the record worker 2 goes on from.
// Before egress runs were adoptable, the successor removed the container
// and ran the run again.
func TestLeaveAndAdoptEgress(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		inFlight bool
	}{{"between requests", false}, {"in flight", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testLeaveAndAdoptEgress(t, tc.inFlight)
		})
	}
}

func testLeaveAndAdoptEgress(t *testing.T, inFlight bool) {
	var served atomic.Int64
	prov := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if served.Add(1) == 3 && inFlight {
			<-r.Context().Done() // held until the leaving worker cuts it
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"type":"message","model":"claude-test","usage":{"input_tokens":10,"output_tokens":7}}`)
	}))
	t.Cleanup(prov.Close)
	port := prov.Listener.Addr().(*net.TCPAddr).Port
	profiles, err := profile.ParseProfiles("t", fmt.Appendf(nil, `[profiles.metered]
image = "img"
command = ["/bin/sh", "-c", "{prompt}"]
coordination = false
egress = ["example.com:%[1]d", "127.0.0.1:%[1]d"]
egress_inject = [{ host = "example.com:%[1]d", header = "x-api-key", from_env = "K" }]
max_model_requests = 4

[profiles.metered.group_budget]
max_model_requests = 100
window = "24h"
`, port))
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(prov.Certificate())
	caDir := t.TempDir() // the installation's CA, kept across the restart
	next := make(chan struct{})
	rig := newAdoptRig(t)
	b := &rig.bundle
	b.rt.Behave = func(spec jail.ContainerSpec) (workertest.Behaviour, error) {
		if spec.Labels[jail.LabelRole] == jail.RoleEgressProof {
			return egressProofBehaviour, nil
		}
		return twoPhases(fmt.Sprintf("https://example.com:%d/v1/messages", port), next), nil
	}
	egressConfig := func(c *worker.Config) {
		c.Profiles, c.EgressResolver, c.EgressUpstreamRoots, c.EgressCADir = profiles, loopbackResolver{}, roots, caDir
		c.LookupEnv = func(k string) (string, bool) { return "sk-worker", k == "K" }
	}
	w1 := rig.startWith(t, "w1", egressConfig)
	id := "adopt-egress-" + ulidLike()
	b.submit(t, messages.RunRequest{ID: id, Profile: "metered", Group: "g1", Prompt: "x"})
	require.Eventually(t, func() bool {
		st, ok := b.state(t, id)
		if inFlight {
			return ok && st.Usage != nil && st.Usage.Requests == 2 && served.Load() == 3
		}
		return ok && st.Usage != nil && st.Usage.Requests == 3 && strings.Contains(output(b.events(t, id), messages.StreamStdout), "phase 1 done")
	}, 20*time.Second, 20*time.Millisecond, "worker 1 serves the first requests")
	d, err := dispatcher.New(b.nc)
	require.NoError(t, err)
	_, err = d.Grant(context.Background(), messages.BudgetScopeRun, id, messages.BudgetSpend{Requests: 1})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, w1.Leave(ctx))
	st, _ := b.state(t, id)
	require.EqualValues(t, 3, st.Usage.Requests, "the record worker 1 left holds every request it sent")

	rig.startWith(t, "w2", egressConfig)
	require.Eventually(t, func() bool { st, ok := b.state(t, id); return ok && st.Adoptions == 1 }, 20*time.Second, 20*time.Millisecond,
		"worker 2 adopts the run")
	close(next)
	st = b.waitFinal(t, id)
	require.Equal(t, messages.StateFailed, st.State, st.Reason)
	require.Contains(t, st.Reason, "budget reached: max_model_requests 5")
	require.Equal(t, 1, st.Attempts)
	require.Equal(t, 1, st.Adoptions)
	require.Equal(t, "w2", st.Worker)
	require.EqualValues(t, 5, served.Load())
	require.NotNil(t, st.Usage)
	require.EqualValues(t, 5, st.Usage.Requests, "both workers' requests: what the provider served")
	require.EqualValues(t, 1, st.Usage.Refused)
	want, known := "R1 200\nR2 200\nR3 200\n", int64(5)
	if inFlight {
		want, known = "R1 200\nR2 200\nR3 error\n", 4
		require.EqualValues(t, 1, st.Usage.Unknown, "the request cut as worker 1 left")
	}
	require.EqualValues(t, 7*known, st.Usage.Tokens.Output)
	require.NotNil(t, st.Egress)
	require.GreaterOrEqual(t, st.Egress.Allowed, int64(5), "egress totals go on")
	require.Equal(t, want+"phase 1 done\nR4 200\nR5 200\nR6 429\n", output(b.events(t, id), messages.StreamStdout))
	spent := groupSpent(t, b, "default.g1")
	require.EqualValues(t, 5, spent.Requests, "the group's budget counts each request once")
	require.EqualValues(t, 7*known, spent.OutputTokens)
	require.Zero(t, spent.ReservedOutputTokens, "nothing left reserved")
	runStarts := 0
	for _, s := range b.rt.Starts() {
		if s.Labels[jail.LabelRunID] == id {
			runStarts++
		}
	}
	require.Equal(t, 1, runStarts, "the run's container was never started again")
}
