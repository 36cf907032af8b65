package console

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// egressBuckets returns the egress_ask buckets, creating them when no
// worker provisioned them yet.
func egressBuckets(t *testing.T, js jetstream.JetStream) (asks, approvals jetstream.KeyValue) {
	t.Helper()
	open := func(cfg jetstream.KeyValueConfig) jetstream.KeyValue {
		kv, err := js.KeyValue(t.Context(), cfg.Bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			kv, err = js.CreateKeyValue(t.Context(), cfg)
		}
		require.NoError(t, err)
		return kv
	}
	return open(jetstream.KeyValueConfig{Bucket: messages.BucketEgressAsks, History: 1, TTL: messages.EgressAskMaxAge}),
		open(jetstream.KeyValueConfig{Bucket: messages.BucketEgressApprovals, History: 1})
}

// putAsk puts question n of run as a worker's proxy does when the run
// connects to host:port, a host of its profile's egress_ask, and returns
// the question.
func putAsk(t *testing.T, asks jetstream.KeyValue, run, profile, host string, port, n int) messages.EgressAsk {
	t.Helper()
	now := time.Now().UTC()
	q := messages.EgressAsk{ID: messages.EgressAskID(run, n), RunID: run, Profile: profile, Worker: "w-elsewhere",
		Host: host, Port: port, Time: now.Add(-90 * time.Second), Until: now.Add(5 * time.Minute)}
	data, err := json.Marshal(q)
	require.NoError(t, err)
	_, err = asks.Put(t.Context(), messages.EgressAskKey(q.ID), data)
	require.NoError(t, err)
	return q
}

// answerOf returns the value of key in kv, or false when it has none.
func answerOf(t *testing.T, kv jetstream.KeyValue, key string) (messages.EgressAnswer, bool) {
	t.Helper()
	e, err := kv.Get(t.Context(), key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return messages.EgressAnswer{}, false
	}
	require.NoError(t, err)
	var a messages.EgressAnswer
	require.NoError(t, json.Unmarshal(e.Value(), &a))
	return a, true
}

// The egress page lists the waiting connections, oldest first, with their
// untrusted names escaped and Allow / Deny for each; the overview says how
// many wait, and a run's page notes its own.
func TestEgressPageLists(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	asks, _ := egressBuckets(t, b.js)
	now := time.Now().UTC()
	b.putStates(t, messages.RunState{Version: 1, ID: "ask-run-1", State: messages.StateRunning, Profile: "net", Pool: "default",
		Worker: "w-elsewhere", QueuedAt: now, StartedAt: now, UpdatedAt: now})

	code, body := b.get(t, "/egress")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "No connection waits for an operator.")
	_, body = b.get(t, "/overview/fragment")
	require.NotContains(t, body, `href="/egress"><`, "no alert while none waits")

	putAsk(t, asks, "ask-run-1", "net", "pypi.org", 443, 1)
	putAsk(t, asks, "ask-run-2", "<b>prof</b>", "<img src=x onerror=alert(1)>\u202e", 8443, 1)
	putAsk(t, asks, "ask-run-3", "net", "gone.example", 443, 1)
	_, err := asks.Put(t.Context(), messages.EgressAnswerKey("ask-run-3.1"), []byte(`{"allow":true,"scope":"run","by":"cli"}`))
	require.NoError(t, err, "answered, its worker not yet done with it")

	code, body = b.get(t, "/egress")
	require.Equal(t, http.StatusOK, code)
	row := between(body, `<tr data-id="ask-run-1.1">`, "</tr>")
	require.Contains(t, row, `<td class="mono"><a href="/runs/ask-run-1">ask-run-1</a></td><td>net</td><td class="mono host">pypi.org:443</td>`)
	require.Contains(t, row, `<input type="hidden" name="csrf" value="`+b.c.core.csrf+`"><input type="hidden" name="id" value="ask-run-1.1">`)
	require.Contains(t, row, `<input type="checkbox" name="profile" value="yes" class="for-profile"> for the whole profile`)
	require.Contains(t, row, `<button type="submit" name="answer" value="allow" class="allow">Allow</button>`)
	require.Contains(t, row, `<button type="submit" name="answer" value="deny" class="danger deny">Deny</button>`)
	require.Regexp(t, `data-since="\d+">1m3\ds</td><td class="num" data-until="\d+">4m5\ds</td>`, row)
	require.NotContains(t, body, "<img", "a host name is text")
	require.NotContains(t, body, "<b>prof")
	require.Contains(t, body, `<td>&lt;b&gt;prof&lt;/b&gt;</td><td class="mono host">&lt;img src=x onerror=alert(1)&gt;&lt;U&#43;202E&gt;:8443</td>`)
	require.NotContains(t, body, "ask-run-3.1", "an answered question is not listed")
	require.Contains(t, body, `answered as <span class="mono">`+b.c.core.cfg.Operator+`</span>`)
	require.NotContains(t, body, `id="more"`)

	_, body = b.get(t, "/overview/fragment")
	require.Contains(t, body, `<li id="egress-alert"><a href="/egress">2 connections wait for an operator</a></li>`)

	_, body = b.get(t, "/runs/ask-run-1")
	require.Contains(t, body, `<p class="message egress-note">Its connection to <span class="mono">pypi.org:443</span> waits for an operator (question <span class="mono">ask-run-1.1</span>, refused in 4m5`)
	require.Contains(t, body, `<a href="/egress">allow or deny it</a>`)
}

// The egress page lists the maxEgressListed oldest and says how many more
// wait.
func TestEgressPageBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	asks, _ := egressBuckets(t, b.js)
	for i := range maxEgressListed + 3 {
		putAsk(t, asks, "flood-"+strconv.Itoa(i), "net", "example.com", 443, 1)
	}
	_, body := b.get(t, "/egress")
	require.Equal(t, maxEgressListed, strings.Count(body, `<tr data-id="flood-`))
	require.Contains(t, body, `<tr data-id="flood-0.1">`, "the oldest are listed")
	require.NotContains(t, body, `<tr data-id="flood-`+strconv.Itoa(maxEgressListed+2)+`.1">`)
	require.Contains(t, body, `Showing the 200 oldest of 203 waiting connections`)
	_, body = b.get(t, "/overview/fragment")
	require.Contains(t, body, `203 connections wait for an operator`)
}

// Allow and Deny post to /egress/answer with the protections of every
// action; the console answers as its operator name, for the run or for
// the profile from now on; a question no longer waiting says so.
func TestEgressAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	asks, approvals := egressBuckets(t, b.js)
	putAsk(t, asks, "ans-1", "net", "pypi.org", 443, 1)
	putAsk(t, asks, "ans-2", "net", "files.example", 8443, 1)
	allow := url.Values{"csrf": {b.c.core.csrf}, "id": {"ans-1.1"}, "answer": {"allow"}}

	resp, _ := b.post(t, "/egress/answer", url.Values{"id": {"ans-1.1"}, "answer": {"allow"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "no CSRF token")
	resp, _ = b.post(t, "/egress/answer", allow, "Sec-Fetch-Site", "cross-site")
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "cross-site")
	resp, _ = b.post(t, "/egress/answer", allow, "Origin", "http://evil.example")
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "foreign origin")
	code, _ := b.get(t, "/egress/answer?id=ans-1.1&answer=allow")
	require.Equal(t, http.StatusMethodNotAllowed, code, "a GET never answers")
	for _, bad := range []url.Values{
		{"id": {"<b>x</b>"}, "answer": {"allow"}}, {"id": {"ans-1"}, "answer": {"allow"}}, {"id": {"ans-1.1"}, "answer": {"maybe"}}, {"id": {"ans-1.1"}},
	} {
		bad.Set("csrf", b.c.core.csrf)
		resp, body := b.post(t, "/egress/answer", bad)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, bad.Encode())
		require.NotContains(t, body, "<b>x", "the id is echoed escaped")
	}
	_, ok := answerOf(t, asks, messages.EgressAnswerKey("ans-1.1"))
	require.False(t, ok, "nothing answered yet")

	// Allow, for the run.
	resp, _ = b.post(t, "/egress/answer", allow, "Sec-Fetch-Site", "same-origin")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "/egress?answered=ans-1.1", resp.Header.Get("Location"))
	a, ok := answerOf(t, asks, messages.EgressAnswerKey("ans-1.1"))
	require.True(t, ok)
	require.True(t, a.Allow)
	require.Equal(t, "run", a.Scope)
	require.Equal(t, b.c.core.cfg.Operator, a.By)
	require.True(t, strings.HasPrefix(a.By, "console@"), a.By)
	_, ok = answerOf(t, approvals, messages.EgressApprovalKey("net", "pypi.org", 443))
	require.False(t, ok, "an answer for the run is not kept for the profile")
	_, body := b.get(t, "/egress?answered=ans-1.1")
	require.Contains(t, body, `<p class="message" id="answered">Answered ans-1.1.</p>`)
	require.NotContains(t, body, `<tr data-id="ans-1.1">`, "answered: no longer listed")

	// A second answer to the same question: someone was first.
	resp, body = b.post(t, "/egress/answer", url.Values{"csrf": {b.c.core.csrf}, "id": {"ans-1.1"}, "answer": {"deny"}})
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	require.Contains(t, body, "another operator answered it first")

	// Deny, for the whole profile.
	resp, _ = b.post(t, "/egress/answer", url.Values{"csrf": {b.c.core.csrf}, "id": {"ans-2.1"}, "answer": {"deny"}, "profile": {"yes"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	a, ok = answerOf(t, asks, messages.EgressAnswerKey("ans-2.1"))
	require.True(t, ok)
	require.Equal(t, messages.EgressAnswer{Allow: false, Scope: "profile", By: b.c.core.cfg.Operator, Time: a.Time}, a)
	p, ok := answerOf(t, approvals, messages.EgressApprovalKey("net", "files.example", 8443))
	require.True(t, ok, "kept for the profile")
	require.Equal(t, a, p)

	// A question that no longer waits (given up: its worker deleted it).
	resp, body = b.post(t, "/egress/answer", url.Values{"csrf": {b.c.core.csrf}, "id": {"ans-9.1"}, "answer": {"allow"}})
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	require.Contains(t, body, "ans-9.1: no connection waits under this id any more: it was answered elsewhere")
	require.Contains(t, body, "or given up")
}

// A read-only console lists the waiting connections without a form, and
// refuses the answer's POST.
func TestEgressReadOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{readOnly: true})
	asks, approvals := egressBuckets(t, b.js)
	putAsk(t, asks, "ro-ask", "net", "pypi.org", 443, 1)
	_, body := b.get(t, "/egress")
	require.Contains(t, body, `<tr data-id="ro-ask.1">`)
	for _, s := range []string{`action="/egress/answer"`, `name="csrf"`, "Allow", "for the whole profile"} {
		require.NotContains(t, body, s)
	}
	require.Contains(t, body, "this console is read only")
	resp, _ := b.post(t, "/egress/answer", url.Values{"csrf": {b.c.core.csrf}, "id": {"ro-ask.1"}, "answer": {"allow"}, "profile": {"yes"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	_, ok := answerOf(t, asks, messages.EgressAnswerKey("ro-ask.1"))
	require.False(t, ok, "nothing answered")
	_, ok = answerOf(t, approvals, messages.EgressApprovalKey("net", "pypi.org", 443))
	require.False(t, ok)
}

// The egress page's live stream says "changed" when a question comes or
// goes, not while nothing changes.
func TestEgressLive(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	asks, _ := egressBuckets(t, b.js)
	putAsk(t, asks, "live-ask", "net", "pypi.org", 443, 1)
	sig := b.c.egress.data(t.Context()).Sig
	stream := b.readSSE(t, "/live/egress?v="+sig, 2500*time.Millisecond, func(string) bool { return false })
	require.NotContains(t, stream, "event: changed", "nothing changed")

	stream = b.readSSEOpened(t, "/live/egress?v="+sig, 10*time.Second, func() {
		putAsk(t, asks, "live-ask", "net", "pypi.org", 443, 2)
	}, func(s string) bool { return strings.Contains(s, "event: changed") })
	require.Contains(t, stream, "event: changed")
}

// Config.Operator defaults to console@<hostname> and is at most 128
// characters.
func TestOperatorName(t *testing.T) {
	t.Parallel()
	require.Equal(t, "ops@example", Config{Operator: " ops@example "}.WithDefaults().Operator)
	require.True(t, strings.HasPrefix(Config{}.WithDefaults().Operator, "console"))
	b := setup(t, setupOpts{})
	_, err := New(Config{Dispatcher: b.d, Operator: strings.Repeat("x", 129)})
	require.Error(t, err)
}
