package console

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// bundle is one test's fleet: an embedded NATS server, a real worker of
// pool default on the fake runtime (prompts are workertest scripts), a
// dispatcher, and the console served by an httptest server.
type bundle struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	d   *dispatcher.Dispatcher
	c   *Console
	srv *httptest.Server
}

type setupOpts struct {
	token    string
	readOnly bool
}

func setup(t *testing.T, o setupOpts) *bundle {
	t.Helper()
	s := workertest.StartServer(t)
	nc := workertest.Connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	startWorker(t, nc, "", 0)
	d, err := dispatcher.New(nc)
	require.NoError(t, err)
	c, err := New(Config{Dispatcher: d, Token: o.token, ReadOnly: o.readOnly})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c.Start(ctx)
	t.Cleanup(c.Stop)
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	return &bundle{nc: nc, js: js, d: d, c: c, srv: srv}
}

// startWorker starts a worker of pool (default when empty) with
// concurrency slots (the worker's default when 0), on the fake runtime,
// stopped when the test ends.
func startWorker(t *testing.T, nc *nats.Conn, pool string, concurrency int) {
	t.Helper()
	w, err := worker.New(nc, worker.Config{StateDir: workertest.StateDir(t), BridgePath: workertest.BridgeFile(t),
		ID: "w-" + strings.ToLower(dispatcher.NewRunID()[20:]), Runtime: workertest.NewTestRuntime(t), FetchWait: time.Second,
		Pool: pool, Concurrency: concurrency, Logger: new(workertest.Logger(t))})
	require.NoError(t, err)
	require.NoError(t, w.Start(t.Context()))
	t.Cleanup(func() {
		// Runs still going (a test that failed early) are stopped at once.
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = w.Stop(ctx)
	})
}

// submit submits req and returns its run id.
func (b *bundle) submit(t *testing.T, req messages.RunRequest) string {
	t.Helper()
	if req.Profile == "" {
		req.Profile = "shell"
	}
	id, err := b.d.Submit(t.Context(), req)
	require.NoError(t, err)
	return id
}

// waitState waits until run id is in state want, in the bucket and in the
// console's cache.
func (b *bundle) waitState(t *testing.T, id string, want messages.State) messages.RunState {
	t.Helper()
	var st messages.RunState
	require.Eventually(t, func() bool {
		var err error
		st, err = b.d.Status(t.Context(), id)
		return err == nil && st.State == want
	}, 10*time.Second, 10*time.Millisecond, "run %s never %s (last: %+v)", id, want, st)
	// The console's cache follows the bucket through a watch, a moment
	// behind a direct read: pages render from the cache.
	require.Eventually(t, func() bool {
		got, ok := b.c.cache.get(id)
		return ok && got.State == want
	}, 10*time.Second, 10*time.Millisecond, "the console's cache never saw run %s %s", id, want)
	return st
}

// coordSend publishes a coordination message of group g as the worker
// relays one run from sends it to run (or "all") to: on JETCREW_COORD,
// subject jetcrew.coord.default.<g>.<to>, header Jetcrew-From.
func (b *bundle) coordSend(t *testing.T, g, from, to, body string) {
	t.Helper()
	m := nats.NewMsg(coordination.Subject(coordtest.Group(g), to))
	m.Data = []byte(body)
	m.Header.Set(coordination.HeaderFrom, from)
	_, err := b.js.PublishMsg(t.Context(), m)
	require.NoError(t, err)
}

// coordOperator publishes what `nats pub -H Jetcrew-From:<claim>
// jetcrew.coord.<g>.<to>.operator` does: an operator's message whose header
// claims to be from run claim.
func (b *bundle) coordOperator(t *testing.T, g, claim, to, body string) {
	t.Helper()
	m := nats.NewMsg(coordination.SubjectFromOperator(coordtest.Group(g), to))
	m.Data = []byte(body)
	m.Header.Set(coordination.HeaderFrom, claim)
	_, err := b.js.PublishMsg(t.Context(), m)
	require.NoError(t, err)
}

// coordRelayed puts on JETCREW_COORD, subject jetcrew.coord.default.<g>.<to>, a
// message claiming to be from run from, through a stream whose RePublish
// targets that subject (what someone allowed to configure streams could
// do), and waits until JETCREW_COORD stored it.
func (b *bundle) coordRelayed(t *testing.T, g, from, to, body string) {
	t.Helper()
	ctx := t.Context()
	subj := coordination.Subject(coordtest.Group(g), to)
	_, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: "RELAY", Subjects: []string{"relay.in"},
		RePublish: &jetstream.RePublish{Source: "relay.in", Destination: subj}})
	require.NoError(t, err)
	m := nats.NewMsg("relay.in")
	m.Data = []byte(body)
	m.Header.Set(coordination.HeaderFrom, from)
	_, err = b.js.PublishMsg(ctx, m)
	require.NoError(t, err)
	coord, err := b.js.Stream(ctx, coordination.StreamName)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		got, err := coord.GetLastMsgForSubject(ctx, subj)
		return err == nil && string(got.Data) == body
	}, 5*time.Second, 10*time.Millisecond)
}

// get fetches path from the console with a loopback Host and returns the
// status and body.
func (b *bundle) get(t *testing.T, path string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.srv.URL+path, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := noRedirect.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// post posts form to path, with extra headers, and returns the response
// (redirects not followed).
func (b *bundle) post(t *testing.T, path string, form url.Values, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.srv.URL+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := noRedirect.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(body)
}

var noRedirect = &http.Client{
	Timeout:       20 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// readSSE reads the server-sent events of path until stop returns true for
// the data read so far, or the timeout; it returns what it read.
func (b *bundle) readSSE(t *testing.T, path string, timeout time.Duration, stop func(string) bool) string {
	t.Helper()
	return b.readSSEOpened(t, path, timeout, func() {}, stop)
}

// readSSEOpened is readSSE that calls opened once the response's headers
// have arrived: the handler is streaming by then.
func (b *bundle) readSSEOpened(t *testing.T, path string, timeout time.Duration, opened func(), stop func(string) bool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.srv.URL+path, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	opened()
	var sb strings.Builder
	buf := make([]byte, 4096)
	for !stop(sb.String()) {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return sb.String()
}

// putStates writes states to the jetcrew-runs bucket, as a worker would,
// and waits until the console's cache has the last of them.
func (b *bundle) putStates(t *testing.T, states ...messages.RunState) {
	t.Helper()
	kv, err := b.js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	for _, st := range states {
		data, err := json.Marshal(st)
		require.NoError(t, err)
		_, err = kv.Put(t.Context(), st.ID, data)
		require.NoError(t, err)
	}
	last := states[len(states)-1]
	require.Eventually(t, func() bool {
		got, ok := b.c.cache.get(last.ID)
		return ok && got.UpdatedAt.Equal(last.UpdatedAt) && got.State == last.State
	}, 10*time.Second, 10*time.Millisecond, "the console's cache never saw %s", last.ID)
}
