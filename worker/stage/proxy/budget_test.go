package proxy

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
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/internal/budgetkv"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// provider is a stand-in for Anthropic's Messages API answering every
// request with 10 input and 7 output tokens, counting what it served.
type provider struct {
	srv    *httptest.Server
	port   string
	served atomic.Int64
	hold   chan struct{} // when set, each answer waits for it
}

func newProvider(t *testing.T) *provider {
	p := &provider{}
	p.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		p.served.Add(1)
		if p.hold != nil {
			<-p.hold
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"type":"message","model":"claude-test","usage":{"input_tokens":10,"output_tokens":7}}`)
	}))
	t.Cleanup(p.srv.Close)
	u, _ := url.Parse(p.srv.URL)
	p.port = u.Port()
	return p
}

type loopback struct{}

func (loopback) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

// meteredRun is one run's egress stage on its own worker's Proxies (its
// own NATS connection), metering example.com (the stand-in).
type meteredRun struct {
	s      *Stage
	client *http.Client
	url    string
}

// startMetered opens the egress stage of run id in group of the default
// pool, of a profile with the extra TOML keys, on a worker of its own
// connected to srv.
func startMetered(t *testing.T, srv *server.Server, prov *provider, id, group, extra string) meteredRun {
	t.Helper()
	return startMeteredWith(t, srv, prov, messages.DefaultPool, id, group, extra, nil)
}

// startMeteredIn is startMetered for a run of pool.
func startMeteredIn(t *testing.T, srv *server.Server, prov *provider, pool, id, group, extra string) meteredRun {
	t.Helper()
	return startMeteredWith(t, srv, prov, pool, id, group, extra, nil)
}

// startMeteredPriced is startMetered on a worker with the price table
// prices.
func startMeteredPriced(t *testing.T, srv *server.Server, prov *provider, id, group, extra string, prices *usage.Prices) meteredRun {
	t.Helper()
	return startMeteredWith(t, srv, prov, messages.DefaultPool, id, group, extra, func(c *Config) { c.Prices = prices })
}

// startMeteredWith is startMetered for a run of pool on a worker whose
// Config mod changes.
func startMeteredWith(t *testing.T, srv *server.Server, prov *provider, pool, id, group, extra string, mod func(*Config)) meteredRun {
	t.Helper()
	ps, err := profile.ParseProfiles("t", fmt.Appendf(nil, `[profiles.metered]
image = "x"
command = ["/bin/sh", "-c", "{prompt}"]
coordination = false
egress = ["example.com:%[1]s", "127.0.0.1:%[1]s"]
egress_inject = [{ host = "example.com:%[1]s", header = "x-api-key", from_env = "K" }]
%[2]s
`, prov.port, extra))
	require.NoError(t, err)
	prof := ps["metered"]
	nc := coordtest.Connect(t, srv)
	cfg := Config{WorkerID: "w-" + id, Pool: pool, NC: nc, Registry: prometheus.NewRegistry(), Log: zerolog.Nop()}
	if mod != nil {
		mod(&cfg)
	}
	p := New(cfg)
	ca, caPEM, err := egress.LoadOrCreateCA(t.TempDir(), "test CA")
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(prov.srv.Certificate())
	port := 0
	fmt.Sscan(prov.port, &port)
	sock := filepath.Join(t.TempDir(), "egress.sock")
	sess, err := egress.Open(egress.Config{Resolver: loopback{}, CA: ca, UpstreamRoots: roots}, id, prof.EgressPolicy(), sock,
		egress.Injection{Name: "example.com", Port: port, Header: "x-api-key", Value: "sk"})
	require.NoError(t, err)
	t.Cleanup(func() { sess.Close() })
	run := &stage.Run{Request: messages.RunRequest{ID: id, Pool: pool, Group: group, Profile: "metered"}, Profile: &prof}
	s := &Stage{p: p, sess: sess}
	s.meter(run, []egress.Injection{{Name: "example.com", Port: port, Header: "x-api-key", Value: "sk"}})
	return meteredRun{s: s, client: trustingClient(t, sock, caPEM), url: "https://example.com:" + prov.port + "/v1/messages"}
}

// trustingClient is an HTTP client of a run whose proxy is the egress
// socket sock, trusting the egress CA caPEM.
func trustingClient(t *testing.T, sock string, caPEM []byte) *http.Client {
	t.Helper()
	trust := x509.NewCertPool()
	require.True(t, trust.AppendCertsFromPEM(caPEM))
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy:3128"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
		TLSClientConfig: &tls.Config{RootCAs: trust},
	}}
}

// post sends one model request and returns its status.
func (m meteredRun) post(t *testing.T) int {
	resp, err := m.client.Post(m.url, "application/json", strings.NewReader(`{"model":"claude-test","max_tokens":8}`))
	if err != nil {
		t.Error(err)
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func budgetServer(t *testing.T) (*server.Server, jetstream.KeyValue) {
	t.Helper()
	srv := coordtest.StartServer(t)
	js, err := jetstream.New(coordtest.Connect(t, srv))
	require.NoError(t, err)
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: messages.BucketBudgets})
	require.NoError(t, err)
	return srv, kv
}

// A group budget shared by two workers: runs of one group on two workers,
// sending at once, share max_model_requests = 10 of group_budget. Every
// response is added to the group's key (exactly: no lost update), the
// provider serves at most the limit plus the requests in flight when it
// was crossed (here two runs × one request at a time), and both runs are
// then refused with the budget named.
func TestGroupBudgetSharedByTwoWorkers(t *testing.T) {
	t.Parallel()
	srv, kv := budgetServer(t)
	prov := newProvider(t)
	const limit = 10
	extra := fmt.Sprintf("[profiles.metered.group_budget]\nmax_model_requests = %d\nwindow = \"1h\"\n", limit)
	runs := []meteredRun{startMetered(t, srv, prov, "a1", "g1", extra), startMetered(t, srv, prov, "b1", "g1", extra)}
	var wg sync.WaitGroup
	var refused atomic.Int64
	for _, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2 * limit {
				if r.post(t) == http.StatusTooManyRequests {
					refused.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	served := prov.served.Load()
	require.GreaterOrEqual(t, served, int64(limit))
	require.LessOrEqual(t, served, int64(limit+len(runs)), "overspent past the documented bound")
	require.EqualValues(t, 4*limit-served, refused.Load())
	for _, r := range runs {
		r.s.sess.Close() // waits for the additions
		b, ok := r.s.sess.Reached()
		require.True(t, ok)
		require.Equal(t, "group", b.Scope)
		require.Contains(t, b.String(), "budget reached: group_budget.max_model_requests 10")
	}
	got, _, err := budgetkv.Get(context.Background(), kv, messages.BudgetKey(messages.BudgetScopeGroup, "default.g1", time.Hour, time.Now()))
	require.NoError(t, err)
	require.Equal(t, served, got.Requests, "the shared key counts every response served, exactly")
	require.Equal(t, 7*served, got.OutputTokens)
}

// A group's budget is its pool's group's: a run of the same group name in
// another pool neither spends it nor is refused by it, and a run alone in
// its own group has a budget of its own even beside a group named after
// it.
func TestGroupBudgetIsThePoolsGroup(t *testing.T) {
	t.Parallel()
	srv, kv := budgetServer(t)
	prov := newProvider(t)
	const limit = 3
	extra := fmt.Sprintf("[profiles.metered.group_budget]\nmax_model_requests = %d\nwindow = \"1h\"\n", limit)
	spent := startMetered(t, srv, prov, "a1", "g1", extra)
	for range limit {
		require.Equal(t, http.StatusOK, spent.post(t))
	}
	require.Equal(t, http.StatusTooManyRequests, spent.post(t), "the group's budget is spent")
	for _, r := range []meteredRun{
		startMeteredIn(t, srv, prov, "other", "b1", "g1", extra), // the same name in another pool
		startMetered(t, srv, prov, "g1", "", extra),              // the run g1 alone, beside group g1
	} {
		require.Equal(t, http.StatusOK, r.post(t))
		r.s.sess.Close()
	}
	spent.s.sess.Close()
	for key, want := range map[string]int64{"default.g1": limit, "other.g1": 1, "default.=g1": 1} {
		got, _, err := budgetkv.Get(context.Background(), kv, messages.BudgetKey(messages.BudgetScopeGroup, key, time.Hour, time.Now()))
		require.NoError(t, err)
		require.Equal(t, want, got.Requests, key)
	}
}

// A group cost budget shared by two workers is never overspent: each
// request's worst case (its max_tokens and its input estimate, priced) is
// held in the group's key, by compare-and-set, before it is sent, and
// replaced by its real cost when it ends; requests sent at once from both
// workers, more than the budget holds, end with the group's cost within
// its limit and nothing left reserved.
func TestGroupCostBudgetNoOvershoot(t *testing.T) {
	t.Parallel()
	srv, kv := budgetServer(t)
	prov := newProvider(t)
	prices, err := usage.ParsePrices("p.toml", []byte("[models.claude-test]\ninput = 1000\noutput = 1000\n"))
	require.NoError(t, err)
	const limit = 0.1 // each answer costs 0.017 and may cost 0.021
	extra := fmt.Sprintf("[profiles.metered.group_budget]\nmax_cost_usd = %v\nwindow = \"1h\"\n", limit)
	runs := []meteredRun{startMeteredPriced(t, srv, prov, "c1", "g2", extra, prices), startMeteredPriced(t, srv, prov, "d1", "g2", extra, prices)}
	var wg sync.WaitGroup
	var ok atomic.Int64
	for _, r := range runs {
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 2 {
					if r.post(t) == http.StatusOK {
						ok.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	for _, r := range runs {
		r.s.sess.Close() // waits for the settlements
	}
	got, _, err := budgetkv.Get(context.Background(), kv, messages.BudgetKey(messages.BudgetScopeGroup, "default.g2", time.Hour, time.Now()))
	require.NoError(t, err)
	t.Logf("served %d of 32; group spent %.4f USD of %v", prov.served.Load(), got.CostUSD, limit)
	require.LessOrEqual(t, got.CostUSD, limit, "the group's budget was overspent")
	require.Positive(t, ok.Load())
	require.Equal(t, prov.served.Load(), ok.Load())
	require.Equal(t, prov.served.Load(), got.Requests, "refused requests are not counted")
	require.InDelta(t, 0, got.ReservedCostUSD, 1e-9, "every reservation was settled")
	require.Zero(t, got.ReservedOutputTokens)
}

// on_budget = "pause": a request past the run's budget is held, the state
// says paused, and an operator's grant (jetcrew budget) lets it go on.
func TestPausedRunResumesAfterGrant(t *testing.T) {
	t.Parallel()
	srv, _ := budgetServer(t)
	prov := newProvider(t)
	r := startMetered(t, srv, prov, "p1", "", "max_model_requests = 1\non_budget = \"pause\"\nbudget_pause = \"30s\"\n")
	require.Equal(t, http.StatusOK, r.post(t))
	done := make(chan int, 1)
	go func() { done <- r.post(t) }()
	require.Eventually(t, func() bool { _, p := r.s.sess.Paused(); return p }, 5*time.Second, 10*time.Millisecond)
	_, changed := r.s.Check(time.Now())
	require.True(t, changed)
	st := messages.RunState{State: messages.StateRunning}
	r.s.Note(&st)
	require.Contains(t, st.Budget, "paused: budget reached: max_model_requests 1")
	select {
	case c := <-done:
		t.Fatalf("answered while paused: %d", c)
	case <-time.After(300 * time.Millisecond):
	}

	d, err := dispatcher.New(coordtest.Connect(t, srv))
	require.NoError(t, err)
	_, err = d.Grant(context.Background(), messages.BudgetScopeRun, "p1", messages.BudgetSpend{Requests: 1})
	require.NoError(t, err)
	select {
	case c := <-done:
		require.Equal(t, http.StatusOK, c)
	case <-time.After(5 * time.Second):
		t.Fatal("the grant did not resume the run")
	}
	require.EqualValues(t, 2, prov.served.Load())
	require.EqualValues(t, 2, r.s.sess.Limits().MaxRequests)
	_, ok := r.s.sess.Reached()
	require.False(t, ok, "a paused-then-raised run has reached nothing")
	stop, _ := r.s.Check(time.Now())
	require.Nil(t, stop)
}

// With no grant within budget_pause the held request is refused and the
// run ends failed, as on_budget = "fail" does.
func TestPauseGivesUp(t *testing.T) {
	t.Parallel()
	srv, _ := budgetServer(t)
	prov := newProvider(t)
	r := startMetered(t, srv, prov, "p2", "", "max_model_requests = 1\non_budget = \"pause\"\nbudget_pause = \"1s\"\n")
	require.Equal(t, http.StatusOK, r.post(t))
	start := time.Now()
	require.Equal(t, http.StatusTooManyRequests, r.post(t))
	require.GreaterOrEqual(t, time.Since(start), time.Second)
	stop, _ := r.s.Check(time.Now())
	require.NotNil(t, stop)
	require.Equal(t, messages.StateFailed, stop.State)
	require.Contains(t, stop.Reason, "budget reached: max_model_requests 1")
}

// A run refused by its budget ends failed even when the agent exits on its
// own before the watch stops it; a run that reached nothing is left alone.
func TestBudgetFailsRunThatExitedItself(t *testing.T) {
	t.Parallel()
	srv, _ := budgetServer(t)
	prov := newProvider(t)
	r := startMetered(t, srv, prov, "f1", "", "max_model_requests = 1\n")
	require.Equal(t, http.StatusOK, r.post(t))
	var resp stage.ExitedResponse
	r.s.Exited(context.Background(), &stage.ExitedRequest{Final: true, State: messages.StateSucceeded}, &resp)
	require.False(t, resp.Fail, "the budget was reached, never passed")
	require.Equal(t, http.StatusTooManyRequests, r.post(t))
	r.s.Exited(context.Background(), &stage.ExitedRequest{Final: true, State: messages.StateSucceeded}, &resp)
	require.True(t, resp.Fail)
	require.Equal(t, "budget reached: max_model_requests 1 (1 model requests sent)", resp.Reason)
}
