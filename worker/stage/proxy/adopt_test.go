package proxy

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// runDir is a stage.Dir at a path of the test's.
type runDir struct{ path string }

func (d runDir) Path() string  { return d.path }
func (runDir) Kept() io.Closer { return nil }
func (runDir) Keep(io.Closer)  {}
func (runDir) Taint()          {}

// adoptingProxies returns a worker's Proxies whose proof passed, with the
// egress CA kept in caDir, for runs of a profile injecting a key for the
// stand-in prov.
func adoptingProxies(t *testing.T, prov *provider, caDir string) (*Proxies, *profile.Profile) {
	t.Helper()
	ps, err := profile.ParseProfiles("t", fmt.Appendf(nil, `[profiles.metered]
image = "x"
command = ["/bin/sh", "-c", "{prompt}"]
coordination = false
egress = ["example.com:%[1]s", "127.0.0.1:%[1]s"]
egress_inject = [{ host = "example.com:%[1]s", header = "x-api-key", from_env = "K" }]
max_model_requests = 3
`, prov.port))
	require.NoError(t, err)
	prof := ps["metered"]
	set := &profile.Set{}
	set.Store(ps)
	roots := x509.NewCertPool()
	roots.AddCert(prov.srv.Certificate())
	p := New(Config{WorkerID: "w", Profiles: set, CADir: caDir, Registry: prometheus.NewRegistry(), Log: zerolog.Nop(),
		Resolver: loopback{}, UpstreamRoots: roots, LookupEnv: func(k string) (string, bool) { return "sk", k == "K" }})
	require.NoError(t, p.loadCA())
	p.settle(nil)
	return p, &prof
}

// An adopted run's egress proxy goes on from its record: served again on
// the socket in its directory (a stale one replaced), its usage and
// budget continued (max_model_requests 3, 2 spent before: one more
// request, then refused). A worker whose egress CA is not the one staged
// in the run's directory refuses to adopt it, saying so.
func TestAdoptGoesOnFromTheRecord(t *testing.T) {
	t.Parallel()
	prov := newProvider(t)
	caDir := t.TempDir()
	p, prof := adoptingProxies(t, prov, caDir)
	dir := t.TempDir()
	require.NoError(t, p.stageCA(dir)) // as the worker that started it did
	sock := filepath.Join(dir, profile.EgressSocketName)
	require.NoError(t, os.WriteFile(sock, nil, 0o600)) // the stale socket
	run := &stage.Run{Request: messages.RunRequest{ID: "ad1", Profile: "metered"}, Profile: prof, Progress: &stage.Progress{}}
	st := messages.RunState{Usage: &messages.UsageTotals{Requests: 2, Tokens: messages.Tokens{Input: 20, Output: 14}},
		Egress: &messages.EgressTotals{Allowed: 2, BytesUp: 100, BytesDown: 200}}

	other, _ := adoptingProxies(t, prov, t.TempDir())
	err := other.For(run).Adopt(context.Background(), &stage.AdoptRequest{Run: run, State: st, Dir: runDir{dir}}, &stage.PrestartResponse{})
	require.ErrorContains(t, err, "another egress CA")

	s := p.For(run)
	require.NoError(t, s.Adopt(context.Background(), &stage.AdoptRequest{Run: run, State: st, Dir: runDir{dir}}, &stage.PrestartResponse{}))
	t.Cleanup(func() { s.Release(&stage.ReleaseRequest{Run: run, Final: true}) })
	m := meteredRun{s: s, client: trustingClient(t, sock, p.caPEM), url: "https://example.com:" + prov.port + "/v1/messages"}
	require.Equal(t, http.StatusOK, m.post(t))
	require.Equal(t, http.StatusTooManyRequests, m.post(t), "the budget counts the requests before the adoption")
	var rec messages.RunState
	rec.State = messages.StateSucceeded
	s.Note(&rec)
	require.EqualValues(t, 3, rec.Usage.Requests)
	require.EqualValues(t, 21, rec.Usage.Tokens.Output)
	require.EqualValues(t, 1, rec.Usage.Refused)
	require.Greater(t, rec.Egress.Allowed, int64(2))
	require.Contains(t, rec.Budget, "max_model_requests")
	require.EqualValues(t, 1, prov.served.Load())
}
