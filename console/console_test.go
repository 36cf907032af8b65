package console

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
)

func TestVisible(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"plain\ttext\n", "plain\ttext\n"},
		{"\x1b[31mred\x1b[0m", "␛[31mred␛[0m"},
		{"bell\a nul\x00 del\x7f", "bell␇ nul␀ del␡"},
		{"c1\u0085", "c1<U+0085>"},
		{"bidi \u202eevil", "bidi <U+202E>evil"},
		{"bad \xff utf8", "bad \uFFFD utf8"},
		{"<script>", "<script>"}, // escaping is the template's and textContent's job
	} {
		require.Equal(t, tc.want, visible(tc.in), "visible(%q)", tc.in)
	}
}

func TestUTF8Carry(t *testing.T) {
	t.Parallel()
	euro := []byte("€") // e2 82 ac
	for i := range len(euro) {
		whole, rest := utf8Carry(append([]byte("ab"), euro[:i]...))
		require.Equal(t, "ab", string(whole))
		require.Equal(t, euro[:i], []byte(string(rest)), "cut after %d bytes", i)
	}
	whole, rest := utf8Carry([]byte("a€"))
	require.Equal(t, "a€", string(whole))
	require.Empty(t, rest)
}

func TestCheckListen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr, token string
		ok          bool
	}{
		{"127.0.0.1:4280", "", true},
		{"[::1]:0", "", true},
		{"localhost:4280", "", true},
		{"0.0.0.0:4280", "", false},
		{":4280", "", false},
		{"10.1.2.3:4280", "", false},
		{"0.0.0.0:4280", "s3cret", true},
		{"nope", "", false},
	} {
		err := CheckListen(tc.addr, tc.token)
		require.Equal(t, tc.ok, err == nil, "CheckListen(%q, %q): %v", tc.addr, tc.token, err)
	}
	require.ErrorIs(t, CheckListen("0.0.0.0:1", ""), ErrAuthRequired)
}

func TestSecurityHeadersAndHost(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	resp, err := http.Get(b.srv.URL + "/runs")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src 'self'")
	require.NotContains(t, resp.Header.Get("Content-Security-Policy"), "unsafe-inline")
	require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))

	// DNS rebinding: a loopback console answers only to loopback names.
	req, _ := http.NewRequest(http.MethodGet, b.srv.URL+"/runs", nil)
	req.Host = "evil.example:4280"
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode)
}

func TestActionsNeedCSRFAndSameOrigin(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	id := b.submit(t, messages.RunRequest{Prompt: "sleep 1h"})
	b.waitState(t, id, messages.StateRunning)

	resp, _ := b.post(t, "/runs/"+id+"/cancel", url.Values{})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "no CSRF token")
	resp, _ = b.post(t, "/runs/"+id+"/cancel", url.Values{"csrf": {"wrong"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "wrong CSRF token")
	resp, _ = b.post(t, "/runs/"+id+"/cancel", url.Values{"csrf": {b.c.core.csrf}}, "Sec-Fetch-Site", "cross-site")
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "cross-site")
	resp, _ = b.post(t, "/runs/"+id+"/cancel", url.Values{"csrf": {b.c.core.csrf}}, "Origin", "http://evil.example")
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "foreign origin")
	require.Equal(t, messages.StateRunning, b.waitState(t, id, messages.StateRunning).State)

	code, _ := b.get(t, "/runs/"+id+"/cancel")
	require.Equal(t, http.StatusMethodNotAllowed, code, "a GET never changes state")
	resp, _ = b.post(t, "/runs/"+id+"/cancel", url.Values{"csrf": {b.c.core.csrf}, "pad": {strings.Repeat("x", maxFormBytes)}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "an oversized form is not read")

	// Without confirm=yes: the confirmation, nothing cancelled.
	resp, body := b.post(t, "/runs/"+id+"/cancel", url.Values{"csrf": {b.c.core.csrf}}, "Sec-Fetch-Site", "same-origin")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, `id="confirm"`)
	require.Contains(t, body, `action="/runs/`+id+`/cancel"`)
	require.Equal(t, messages.StateRunning, b.waitState(t, id, messages.StateRunning).State)
	resp, _ = b.post(t, "/runs/"+id+"/cancel", url.Values{"csrf": {b.c.core.csrf}, "confirm": {"yes"}}, "Sec-Fetch-Site", "same-origin")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "/runs/"+id, resp.Header.Get("Location"))
	b.waitState(t, id, messages.StateCancelled)
}

func TestAuthToken(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{token: "s3cret-token"})
	code, _ := b.get(t, "/runs")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = b.get(t, "/runs", "Accept", "text/html")
	require.Equal(t, http.StatusSeeOther, code, "a browser is sent to the login form")
	code, _ = b.get(t, "/runs", "Authorization", "Bearer nope")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = b.get(t, "/runs", "Authorization", "Bearer s3cret-token")
	require.Equal(t, http.StatusOK, code)
	code, _ = b.get(t, "/live/runs")
	require.Equal(t, http.StatusUnauthorized, code, "live streams need the token too")
	code, _ = b.get(t, "/static/app.css")
	require.Equal(t, http.StatusOK, code, "the login form's style sheet is public")
	code, body := b.get(t, "/login")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `name="token"`)

	resp, _ := b.post(t, "/login", url.Values{"csrf": {b.c.core.csrf}, "token": {"nope"}})
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	resp, _ = b.post(t, "/login", url.Values{"csrf": {b.c.core.csrf}, "token": {"s3cret-token"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	var ck *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == authCookie {
			ck = c
		}
	}
	require.NotNil(t, ck)
	require.True(t, ck.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	code, _ = b.get(t, "/runs", "Cookie", authCookie+"="+ck.Value)
	require.Equal(t, http.StatusOK, code)
}

// What a run prints, its labels and its failure reason are hostile: the
// pages show them as inert text with control characters made visible.
func TestHostileTextIsInert(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const evil = `<script>alert(1)</script><img src=x onerror=alert(2)>`
	id := b.submit(t, messages.RunRequest{Prompt: "out " + evil + "\x1b[31m;exit 3", Labels: map[string]string{"note": evil}})
	b.waitState(t, id, messages.StateFailed)

	for _, path := range []string{"/runs", "/runs/" + id, "/dead-letters"} {
		code, body := b.get(t, path)
		require.Equal(t, http.StatusOK, code, path)
		require.NotContains(t, body, "<script>alert", path)
		require.NotContains(t, body, "<img src=x", path)
	}
	_, body := b.get(t, "/runs")
	require.Contains(t, body, "&lt;script&gt;alert(1)&lt;/script&gt;")

	stream := b.readSSE(t, "/live/run/"+id, 15*time.Second, func(s string) bool { return strings.Contains(s, `"type":"finished"`) })
	require.NotContains(t, stream, "<script>", "the live stream's JSON escapes markup")
	require.Contains(t, stream, `\u003cscript\u003ealert(1)\u003c/script\u003e`)
	require.Contains(t, stream, "␛[31m", "the escape character is shown, not obeyed")
}

func TestRunsListFiltersAndPaging(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	kv, err := b.js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	base := time.Now().Add(-time.Hour).UTC()
	for i := range 120 {
		st := messages.RunState{Version: 1, ID: fmt.Sprintf("run-%03d", i), State: messages.StateSucceeded, Profile: "shell",
			Pool: "p" + fmt.Sprint(i%2), Group: "g" + fmt.Sprint(i%3), Labels: map[string]string{"n": fmt.Sprint(i % 5)},
			QueuedAt: base.Add(time.Duration(i) * time.Second), UpdatedAt: base}
		if i%4 == 0 {
			st.State = messages.StateFailed
		}
		data, _ := json.Marshal(st)
		_, err := kv.Put(t.Context(), st.ID, data)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { _, ok := b.c.cache.get("run-119"); return ok }, 15*time.Second, 10*time.Millisecond)

	_, page1 := b.get(t, "/runs?q=run-")
	require.Contains(t, page1, "120 run(s)")
	require.Contains(t, page1, `data-id="run-119"`)
	require.NotContains(t, page1, `data-id="run-069"`)
	next := hrefOf(page1, "next")
	require.NotEmpty(t, next)
	_, page2 := b.get(t, next)
	require.Contains(t, page2, `data-id="run-069"`)
	require.NotContains(t, page2, `data-id="run-070"`)
	require.NotContains(t, page2, `data-id="run-019"`)

	_, f := b.get(t, "/runs?state=failed&pool=p0&label=n%3D0")
	// failed: i%4==0; pool p0: even; label n=0: i%5==0 → i%20==0: 6 runs.
	require.Contains(t, f, "6 run(s)")
	_, g := b.get(t, "/runs?group=g1&q=run-")
	require.Contains(t, g, "40 run(s)")

	code, _ := b.get(t, "/runs?q=run-007")
	require.Equal(t, http.StatusSeeOther, code, "an exact id goes to the run")
}

// hrefOf returns the URL of the link with id on page s, unescaped; empty
// when there is none.
func hrefOf(s, id string) string {
	i := strings.Index(s, `" id="`+id+`"`)
	if i < 0 {
		return ""
	}
	j := strings.LastIndex(s[:i], `href="`)
	return html.UnescapeString(s[j+len(`href="`) : i])
}

func between(s, from, to string) string {
	_, rest, ok := strings.Cut(s, from)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, to)
	return v
}

// A run submitted while the list's live stream is open arrives on it.
func TestLiveRunsStream(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	id := dispatcher.NewRunID()
	// The handler subscribes before it answers: the run is submitted
	// once the stream is open, never before.
	stream := b.readSSEOpened(t, "/live/runs?pool=default", 10*time.Second, func() {
		_, err := b.d.Submit(context.Background(), messages.RunRequest{ID: id, Profile: "shell", Prompt: "out hi"})
		require.NoError(t, err)
	}, func(s string) bool {
		return strings.Contains(s, `"id":"`+id+`","state":"succeeded"`)
	})
	require.Contains(t, stream, `"id":"`+id+`","state":"queued"`)
}

func TestDeadLettersReplayAfterConfirmation(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	id := b.submit(t, messages.RunRequest{Prompt: "exit 3"})
	b.waitState(t, id, messages.StateFailed)
	require.Eventually(t, func() bool { _, err := b.d.LastDeadLetter(t.Context(), id); return err == nil }, 15*time.Second, 10*time.Millisecond)

	_, body := b.get(t, "/dead-letters")
	require.Contains(t, body, "exit code 3")
	require.Contains(t, body, id)

	resp, body := b.post(t, "/dead-letters/replay", url.Values{"csrf": {b.c.core.csrf}, "run": {id}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, `name="confirm" value="yes"`, "asks first")
	st, _ := b.d.Status(t.Context(), id)
	require.Equal(t, 0, st.Replays, "nothing replayed before the confirmation")

	resp, body = b.post(t, "/dead-letters/replay", url.Values{"csrf": {b.c.core.csrf}, "run": {id}, "confirm": {"yes"}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, "Replayed 1 run(s)")
	require.Eventually(t, func() bool {
		st, err := b.d.Status(t.Context(), id)
		return err == nil && st.Replays == 1 && st.State.Final()
	}, 10*time.Second, 10*time.Millisecond)
}

func TestOverviewAlertsAndGroup(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	// A pool with a consumer but no worker: its run stays queued.
	_, err := worker.Provision(t.Context(), b.js, worker.ProvisionConfig{Pool: "idle"})
	require.NoError(t, err)
	b.submit(t, messages.RunRequest{Pool: "idle", Prompt: "out x"})
	require.Eventually(t, func() bool {
		_, body := b.get(t, "/overview/fragment")
		return strings.Contains(body, "pool idle has 1 queued run(s) and no worker is pulling from it")
	}, 15*time.Second, 20*time.Millisecond)
	_, body := b.get(t, "/")
	require.Contains(t, body, `<a href="/runs?pool=idle">idle</a>`)
	require.Contains(t, body, "Runs held")

	a := b.submit(t, messages.RunRequest{Group: "team", Prompt: "out a"})
	c := b.submit(t, messages.RunRequest{Group: "team", Prompt: "out c"})
	b.coordSend(t, "team", a, c, "please review <b>this</b>\x1b[0m")
	b.coordSend(t, "other", a, c, "not this group")
	b.coordRelayed(t, "team", a, c, "relayed by the server")
	b.coordOperator(t, "team", a, c, "forged sender")
	// A run has a state (and a row) once a worker has taken it: the
	// submitter writes none.
	require.Eventually(t, func() bool {
		_, body := b.get(t, "/groups/default/team")
		return strings.Contains(body, a) && strings.Contains(body, c)
	}, 10*time.Second, 20*time.Millisecond, "both runs of the group listed")
	stream := b.readSSE(t, "/live/group/default/team", 15*time.Second, func(s string) bool { return strings.Contains(s, "forged sender") })
	require.Contains(t, stream, `"from":"`+a+`","to":"`+c+`","text":"please review \u003cb\u003ethis\u003c/b\u003e␛[0m"`)
	// An operator's message is from "operator" whatever Jetcrew-From says
	//, as the runs read it.
	require.Contains(t, stream, `"from":"operator","to":"`+c+`","text":"forged sender"`)
	require.NotContains(t, stream, "not this group")
	// The runs never read what the server relayed: neither does the page.
	require.NotContains(t, stream, "relayed by the server")
}

// The live-stream cap refuses one stream more with 503.
func TestMaxStreams(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for range cap(b.c.hub.streams) {
		b.c.hub.streams <- struct{}{}
	}
	code, _ := b.get(t, "/live/runs")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Eventually(t, func() bool {
		b.c.cache.mu.RLock()
		defer b.c.cache.mu.RUnlock()
		return len(b.c.cache.subs) == 0
	}, 10*time.Second, 10*time.Millisecond, "a refused stream leaves no subscription to the cache")
}

func TestAlerts(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	pool := func(p dispatcher.PoolStats, queuedRuns int) poolRow {
		return poolRow{PoolStats: p, QueuedRuns: queuedRuns}
	}
	for _, tc := range []struct {
		name    string
		pools   []poolRow
		workers int
		want    []string
	}{
		{"quiet", []poolRow{pool(dispatcher.PoolStats{Pool: "a", Waiting: 1}, 0)}, 1, nil},
		{"queued, no worker", []poolRow{pool(dispatcher.PoolStats{Pool: "a", Queued: 2}, 2)}, 0,
			[]string{"pool a has 2 queued run(s) and no worker is alive"}},
		{"queued, nobody pulling", []poolRow{pool(dispatcher.PoolStats{Pool: "a", Queued: 3}, 3)}, 2,
			[]string{"pool a has 3 queued run(s) and no worker is pulling from it"}},
		{"queued, being pulled", []poolRow{pool(dispatcher.PoolStats{Pool: "a", Queued: 3, Waiting: 1}, 3)}, 2, nil},
		{"max ack pending", []poolRow{pool(dispatcher.PoolStats{Pool: "a", Queued: 5, InFlight: 4, MaxAckPending: 4}, 5)}, 1,
			[]string{"pool a is at its max ack pending (4 runs in flight): new runs wait"}},
		{"state says queued, consumer empty, no worker", []poolRow{pool(dispatcher.PoolStats{Pool: "b"}, 1)}, 0,
			[]string{"pool b has 1 queued run(s) and no worker is alive"}},
		{"requests for a pool nobody serves", []poolRow{{PoolStats: dispatcher.PoolStats{Pool: "nopool", Queued: 300},
			Unserved: &dispatcher.UnservedPool{Pool: "nopool", Requests: 300, Oldest: now.Add(-time.Hour), Expires: now.Add(167 * time.Hour)}}}, 1,
			[]string{"pool nopool has 300 request(s) in JETCREW_RUNS and no worker serves it (no workers-nopool consumer): the oldest was stored 1h0m0s ago and is removed in 167h0m0s (the stream's max age); start a worker with --pool nopool, or remove them: nats stream purge JETCREW_RUNS --subject jetcrew.runs.nopool"}},
	} {
		require.Equal(t, tc.want, alerts(tc.pools, tc.workers, now), tc.name)
	}
}

// Requests published to a pool no worker serves show on the overview, as
// an alert and a row, with when they are removed.
func TestOverviewReportsUnservedPool(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for i := range 3 {
		_, err := b.js.Publish(t.Context(), messages.SubjectRuns("nopool"), fmt.Appendf(nil, `{"id":"n%d","profile":"shell","pool":"nopool"}`, i))
		require.NoError(t, err)
	}
	_, body := b.get(t, "/overview/fragment")
	require.Contains(t, body, "pool nopool has 3 request(s) in JETCREW_RUNS and no worker serves it (no workers-nopool consumer): the oldest was stored ")
	require.Contains(t, body, "(the stream&#39;s max age); start a worker with --pool nopool, or remove them: nats stream purge JETCREW_RUNS --subject jetcrew.runs.nopool")
	require.Contains(t, body, `<a href="/runs?pool=nopool">nopool</a> <span class="muted">(no worker serves it)</span>`)
	require.NotContains(t, body, "pool default", "the served pool raises nothing")

	// Requests spread over many pools: a row and an alert for the first
	// few, one line for the rest.
	for i := range dispatcher.MaxOldestLookups + 3 {
		_, err := b.js.Publish(t.Context(), messages.SubjectRuns(fmt.Sprintf("p%02d", i)), []byte(`{"profile":"shell"}`))
		require.NoError(t, err)
	}
	_, body = b.get(t, "/overview/fragment")
	require.Equal(t, dispatcher.MaxOldestLookups, strings.Count(body, "(no worker serves it)"))
	require.Contains(t, body, "4 more pool(s) that no worker serves hold 4 request(s) in JETCREW_RUNS")
}

// fakeWatcher replays scripted watches: each call of WatchRuns sends one
// script's updates, then fails (as a lost connection would).
type fakeWatcher struct {
	scripts [][]dispatcher.RunUpdate
	calls   atomic.Int32
}

func (f *fakeWatcher) WatchRuns(ctx context.Context, fn func(dispatcher.RunUpdate)) error {
	n := int(f.calls.Load())
	if n >= len(f.scripts) {
		<-ctx.Done()
		return nil
	}
	for _, u := range f.scripts[n] {
		fn(u)
	}
	f.calls.Add(1)
	return fmt.Errorf("connection lost")
}

// A watch that starts again forgets the runs deleted while none ran.
func TestCacheResync(t *testing.T) {
	t.Parallel()
	st := func(id string) dispatcher.RunUpdate {
		return dispatcher.RunUpdate{ID: id, State: messages.RunState{ID: id, State: messages.StateQueued}}
	}
	synced := dispatcher.RunUpdate{Synced: true}
	w := &fakeWatcher{scripts: [][]dispatcher.RunUpdate{
		{st("a"), st("b"), synced, st("c")},
		{st("a"), st("c"), synced},
	}}
	c := newCache()
	ctx, cancel := context.WithCancel(t.Context())
	var errs []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(ctx, w, time.Millisecond, func(err error) { errs = append(errs, err.Error()) })
	}()
	require.Eventually(t, func() bool { return w.calls.Load() == 2 }, 15*time.Second, time.Millisecond)
	require.Eventually(t, func() bool {
		_, a := c.get("a")
		_, b := c.get("b")
		_, cc := c.get("c")
		return a && !b && cc
	}, 15*time.Second, time.Millisecond, "b was deleted while no watch ran")
	cancel()
	<-done
	require.Equal(t, []string{"connection lost"}, errs, "a repeated failure is reported once")
}
