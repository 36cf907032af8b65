package console

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/roles"
)

// roleBundle is a bundle on a server with authentication, its users
// jetcrew's roles (roles.Permissions, as `jetcrew up --auth` makes them):
// the worker connects as the worker, the test (nc, js, d) as the operator,
// and the console as the role setupRole was given. violations are the
// permissions violations the server reported on the console's connection.
type roleBundle struct {
	*bundle
	// worker is the worker's connection (its role).
	worker     *nats.Conn
	mu         sync.Mutex
	violations []string
}

func (rb *roleBundle) refused() []string {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	return append([]string(nil), rb.violations...)
}

func setupRole(t *testing.T, role roles.Role) *roleBundle {
	t.Helper()
	keys := map[roles.Role]nkeys.KeyPair{}
	var users []*server.NkeyUser
	for _, r := range roles.All {
		kp, err := nkeys.CreateUser()
		require.NoError(t, err)
		pub, err := kp.PublicKey()
		require.NoError(t, err)
		g, err := roles.Permissions(r)
		require.NoError(t, err)
		keys[r] = kp
		users = append(users, &server.NkeyUser{Nkey: pub, Permissions: g.ServerPermissions()})
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		NoSigs: true, NoLog: true, Nkeys: users})
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	rb := &roleBundle{}
	connect := func(r roles.Role, opts ...nats.Option) *nats.Conn {
		kp := keys[r]
		pub, err := kp.PublicKey()
		require.NoError(t, err)
		nc, err := nats.Connect(s.ClientURL(), append(opts, nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix(roles.InboxPrefix(r)))...)
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}
	rb.worker = connect(roles.Worker)
	startWorker(t, rb.worker, "", 0)
	nc := connect(roles.Operator)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	d, err := dispatcher.New(nc)
	require.NoError(t, err)
	cnc := connect(role, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		rb.mu.Lock()
		rb.violations = append(rb.violations, err.Error())
		rb.mu.Unlock()
	}))
	cd, err := dispatcher.New(cnc)
	require.NoError(t, err)
	// The worker provisions the streams and bucket; the console waits for
	// them.
	require.Eventually(t, func() bool { _, err := d.Pools(t.Context()); return err == nil }, 10*time.Second, 10*time.Millisecond)
	c, err := New(Config{Dispatcher: cd})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c.Start(ctx)
	t.Cleanup(c.Stop)
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	rb.bundle = &bundle{nc: nc, js: js, d: d, c: c, srv: srv}
	return rb
}

// As the observer, every page and live stream of the console works: the
// server refuses nothing it reads (the overview no longer waits 5 seconds
// on the pools' consumers and then shows none), and an action it may not
// take is refused at once, the role it needs named, never after the
// action's 15-second deadline.
func TestObserverConsole(t *testing.T) {
	t.Parallel()
	b := setupRole(t, roles.Observer)
	g := "crew-obs"
	id := b.submit(t, messages.RunRequest{Group: g, Prompt: "out hi;sleep 1h"})
	failed := b.submit(t, messages.RunRequest{Prompt: "exit 3"})
	b.waitState(t, id, messages.StateRunning)
	b.waitState(t, failed, messages.StateFailed)
	require.Eventually(t, func() bool { _, err := b.d.LastDeadLetter(t.Context(), failed); return err == nil }, 10*time.Second, 10*time.Millisecond)
	_, err := b.d.Send(t.Context(), coordtest.Group(g), id, "hello from the test")
	require.NoError(t, err)

	for _, path := range []string{"/", "/overview/fragment", "/runs", "/runs/" + id, "/runs/" + failed, "/groups/default/" + g,
		"/dead-letters", "/egress", "/egress/fragment", "/questions"} {
		start := time.Now()
		code, body := b.get(t, path)
		took := time.Since(start)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
		require.Less(t, took, 2*time.Second, "%s took %s; refused: %v", path, took, b.refused())
		require.NotContains(t, body, "ermission", path)
	}
	_, body := b.get(t, "/")
	require.Contains(t, body, `<a href="/runs?pool=default">default</a>`, "the overview shows the pool's queue")
	// The live streams read what the pages show.
	for _, path := range []string{"/live/overview", "/live/runs", "/live/run/" + id, "/live/group/default/" + g, "/live/egress"} {
		b.readSSE(t, path, time.Second, func(string) bool { return false })
	}
	got := b.readSSE(t, "/live/group/default/"+g, 5*time.Second, func(s string) bool { return strings.Contains(s, "hello from the test") })
	require.Contains(t, got, "hello from the test")
	require.Empty(t, b.refused(), "the server refused nothing the observer's console read")

	// Actions: refused by the server, reported at once with the role.
	for _, a := range []struct {
		path string
		form url.Values
	}{
		{"/runs/" + id + "/cancel", url.Values{"confirm": {"yes"}}},
		{"/runs/" + failed + "/replay", nil},
		{"/dead-letters/replay", url.Values{"run": {failed}, "confirm": {"yes"}}},
		{"/dead-letters/discard", url.Values{"run": {failed}, "confirm": {"yes"}}},
		{"/dead-letters/archive", url.Values{"run": {failed}, "confirm": {"yes"}}},
		{"/runs/" + id + "/send", url.Values{"text": {"stop"}}},
		{"/groups/default/" + g + "/send", url.Values{"to": {"all"}, "text": {"stop"}}},
		{"/runs/" + id + "/budget", url.Values{"usd": {"1"}}},
	} {
		form := url.Values{"csrf": {b.c.core.csrf}}
		for k, v := range a.form {
			form[k] = v
		}
		start := time.Now()
		resp, body := b.post(t, a.path, form)
		took := time.Since(start)
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s: %s", a.path, body)
		require.Contains(t, body, "needs the operator role", a.path)
		require.Less(t, took, 2*time.Second, "%s refused after %s", a.path, took)
	}
	st, err := b.d.Status(t.Context(), id)
	require.NoError(t, err)
	require.Equal(t, messages.StateRunning, st.State, "the refused cancel changed nothing")
}

// The operator role may discard a dead letter (a purge of its run's subject
// of JETCREW_FAILED), without the workers' right to delete one message.
func TestOperatorDiscardsDeadLetter(t *testing.T) {
	t.Parallel()
	b := setupRole(t, roles.Operator)
	failed := b.submit(t, messages.RunRequest{Prompt: "exit 3"})
	b.waitState(t, failed, messages.StateFailed)
	require.Eventually(t, func() bool { _, err := b.d.LastDeadLetter(t.Context(), failed); return err == nil }, 10*time.Second, 10*time.Millisecond)
	// Archive and unarchive (a mark published on, then purged from,
	// jetcrew.failed.<pool>.<run_id>.archived) under the role's own rights.
	resp, body := b.post(t, "/dead-letters/archive", url.Values{"csrf": {b.c.core.csrf}, "run": {failed}, "confirm": {"yes"}})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, body, "Archived the dead letters of run "+failed)
	_, body = b.get(t, "/dead-letters?archived=1")
	require.Contains(t, body, `data-run="`+failed+`"`)
	resp, body = b.post(t, "/dead-letters/archive?undo=1", url.Values{"csrf": {b.c.core.csrf}, "run": {failed}, "confirm": {"yes"}})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.NoError(t, b.d.Archive(t.Context(), failed))
	resp, body = b.post(t, "/dead-letters/discard", url.Values{"csrf": {b.c.core.csrf}, "run": {failed}, "confirm": {"yes"}})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, body, "Discarded 1 dead letter(s)")
	_, err := b.d.LastDeadLetter(t.Context(), failed)
	require.ErrorIs(t, err, dispatcher.ErrNoDeadLetter)
	require.Empty(t, b.refused())
}

// From the group and run pages an operator sends a message as the
// operator: it lands on jetcrew.coord.<group>.<recipient>.operator, with no
// sender header whatever the form says, so the runs read it from
// "operator".
func TestOperatorSendsMessage(t *testing.T) {
	t.Parallel()
	b := setupRole(t, roles.Operator)
	g := "crew-send"
	id := b.submit(t, messages.RunRequest{Group: g, Prompt: "out hi;sleep 1h"})
	b.waitState(t, id, messages.StateRunning)
	_, page := b.get(t, "/groups/default/"+g)
	require.Contains(t, page, `action="/groups/default/`+g+`/send"`)
	require.Contains(t, page, `<option value="`+id+`">`)
	_, page = b.get(t, "/runs/"+id)
	require.Contains(t, page, `action="/runs/`+id+`/send"`)

	coord, err := b.js.Stream(t.Context(), coordination.StreamName)
	require.NoError(t, err)
	for _, c := range []struct {
		path, to string
		form     url.Values
	}{
		{"/groups/default/" + g + "/send", "all", url.Values{"to": {"all"}}},
		{"/groups/default/" + g + "/send", id, url.Values{"to": {id}}},
	} {
		text := "from the console to " + c.to + " via " + c.path
		form := url.Values{"csrf": {b.c.core.csrf}, "text": {text}, "from": {id}, coordination.HeaderFrom: {id}}
		for k, v := range c.form {
			form[k] = v
		}
		resp, body := b.post(t, c.path, form, coordination.HeaderFrom, id)
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
		subj := coordination.SubjectFromOperator(coordtest.Group(g), c.to)
		m, err := coord.GetLastMsgForSubject(t.Context(), subj)
		require.NoError(t, err, subj)
		require.Equal(t, text, string(m.Data))
		require.Empty(t, m.Header.Get(coordination.HeaderFrom), "no sender header")
		from, to := coordination.Sender(m.Subject, m.Header.Get(coordination.HeaderFrom))
		require.Equal(t, coordination.RecipientOperator, from)
		require.Equal(t, c.to, to)
	}

	// The run page's box steers the run (dispatcher.Steer): this agent's
	// CLI takes no input while it runs, so the steer is queued in its
	// inbox, as from the operator whatever the form says, and the page
	// says so.
	text := "a steer from the run page"
	resp, body := b.post(t, "/runs/"+id+"/send", url.Values{"csrf": {b.c.core.csrf}, "text": {text}, "from": {id}}, coordination.HeaderFrom, id)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, body, "Queued")
	require.Contains(t, body, "takes no input while it runs")
	m, err := coord.GetLastMsgForSubject(t.Context(), coordination.Subject(coordtest.Group(g), id))
	require.NoError(t, err)
	require.Equal(t, text, string(m.Data))
	from, _ := coordination.Sender(m.Subject, m.Header.Get(coordination.HeaderFrom))
	require.Equal(t, coordination.RecipientOperator, from)

	for _, c := range []struct {
		path string
		form url.Values
		want string
	}{
		{"/groups/default/" + g + "/send", url.Values{"to": {"all"}}, "the message is empty"},
		{"/groups/default/" + g + "/send", url.Values{"to": {"x.y"}, "text": {"hi"}}, "recipient"},
		{"/groups/default/" + g + "/send", url.Values{"to": {"operator"}, "text": {"hi"}}, "an operator sends to a run id"},
		{"/runs/no-such-run/send", url.Values{"text": {"hi"}}, "no run no-such-run is known"},
		{"/runs/" + id + "/send", url.Values{"text": {""}}, "the message is empty"},
	} {
		c.form.Set("csrf", b.c.core.csrf)
		resp, body := b.post(t, c.path, c.form)
		require.GreaterOrEqual(t, resp.StatusCode, 400, c.path)
		require.Contains(t, body, c.want, c.path)
	}
	resp, _ = b.post(t, "/groups/default/"+g+"/send", url.Values{"to": {"all"}, "text": {"hi"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "no CSRF token, no message")
}

// A read-only console shows no send form, and refuses the POST.
func TestReadOnlyHidesSend(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{readOnly: true})
	g := "crew-ro"
	id := b.submit(t, messages.RunRequest{Group: g, Prompt: "out hi;sleep 1h"})
	b.waitState(t, id, messages.StateRunning)
	for _, path := range []string{"/groups/default/" + g, "/runs/" + id} {
		_, page := b.get(t, path)
		require.NotContains(t, page, "send-form", path)
	}
	resp, _ := b.post(t, "/groups/default/"+g+"/send", url.Values{"csrf": {b.c.core.csrf}, "to": {"all"}, "text": {"hi"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
}

func TestSubjectMatches(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		pattern, subject string
		want             bool
	}{
		{"jetcrew.cancel.*", "jetcrew.cancel.r1", true},
		{"jetcrew.cancel.*", "jetcrew.cancel", false},
		{"jetcrew.cancel.*", "jetcrew.cancel.r1.x", false},
		{"jetcrew.coord.*.*.operator", "jetcrew.coord.g.all.operator", true},
		{"jetcrew.coord.*.*.operator", "jetcrew.coord.g.all", false},
		{"$KV.b.>", "$KV.b.grant.run.x", true},
		{"$KV.b.>", "$KV.b", false},
		{"$KV.b.>", "$KV.c.x", false},
	} {
		require.Equal(t, c.want, subjectMatches(c.pattern, c.subject), "%s ~ %s", c.pattern, c.subject)
	}
}

// In the browser, the observer's console shows the overview's pools and a
// cancel the server refuses says so at once, naming the role it needs.
func TestBrowserObserverRefused(t *testing.T) {
	t.Parallel()
	b := setupRole(t, roles.Observer)
	ctx, exceptions := browser(t)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	id := b.submit(t, messages.RunRequest{Prompt: "out hi;sleep 1h"})
	b.waitState(t, id, messages.StateRunning)

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.srv.URL+"/")))
	poll(t, ctx, 5*time.Second, `document.querySelector('#overview-body a[href="/runs?pool=default"]') !== null`, "the overview shows the pool")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.srv.URL+"/runs/"+id)))
	poll(t, ctx, 10*time.Second, `document.getElementById("output")?.textContent.includes("hi")`, "the run's output streams in")
	click(t, ctx, chromedp.ID("cancel"))
	poll(t, ctx, 5*time.Second, `document.getElementById("confirm") !== null`, "the cancel asks for a confirmation")
	start := time.Now()
	click(t, ctx, chromedp.ID("confirm"))
	poll(t, ctx, 3*time.Second, `document.body.innerText.includes("needs the operator role")`, "the refusal is shown, naming the role")
	t.Logf("the refused cancel was reported %s after the click", time.Since(start).Round(time.Millisecond))
	shot(t, ctx, "observer-refused")
	require.Empty(t, exceptions(), "no JavaScript error")
	require.Len(t, b.refused(), 1, "one refusal, the cancel's: %v", b.refused())
}
