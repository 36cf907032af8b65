package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/roles"
)

var (
	natsURLLine = regexp.MustCompile(`(?m)^NATS_URL=(nats://127\.0\.0\.1:\d+)$`)
	uiURLLine   = regexp.MustCompile(`(?m)^JETCREW_UI=(http://127\.0\.0\.1:\d+/)$`)
)

// `up` serves the console and announces it on its own line after the
// eval-able NATS_URL= line; the console lists a run submitted through NATS.
func TestUpServesConsole(t *testing.T) {
	t.Parallel()
	up := runInBackground(t, "up", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--ui", "127.0.0.1:0")
	var natsURL, uiURL string
	require.Eventually(t, func() bool {
		out := up.app.stdout.String()
		n, u := natsURLLine.FindStringSubmatch(out), uiURLLine.FindStringSubmatch(out)
		if n == nil || u == nil {
			return false
		}
		natsURL, uiURL = n[1], u[1]
		return true
	}, 15*time.Second, 20*time.Millisecond, "stderr: %s", up.app.stderr.String())
	require.True(t, strings.HasPrefix(up.app.stdout.String(), "NATS_URL="), "NATS_URL= stays the first line")

	code, stdout, stderr := cli(t, natsURL, "submit", "--wait", "out via console")
	require.Equal(t, 0, code, "stderr: %s", stderr)
	require.Equal(t, "via console\n", stdout)
	require.Eventually(t, func() bool {
		resp, err := http.Get(uiURL + "runs")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.Contains(string(body), "succeeded") &&
			strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'")
	}, 10*time.Second, 20*time.Millisecond, "the console lists the run")
	require.Equal(t, 0, up.stop(), "stderr: %s", up.app.stderr.String())
}

// The default console address taken by someone else is not fatal for `up`.
func TestUpConsoleDefaultInUse(t *testing.T) {
	t.Parallel()
	a := serveCmds{newTestApp(nil, nil).app}
	l, err := a.consoleListener("127.0.0.1:0", false)
	require.NoError(t, err)
	defer l.Close()
	again, err := a.consoleListener(l.Addr().String(), false)
	require.NoError(t, err, "the default address in use only disables the console")
	require.Nil(t, again)
	_, err = a.consoleListener(l.Addr().String(), true)
	require.Error(t, err, "an address the user chose must be served")
}

// `ui` refuses a non-loopback address without a token, and serves with one.
func TestUIListenNeedsToken(t *testing.T) {
	t.Parallel()
	a := newTestApp(nil, nil)
	code := a.run(t.Context(), []string{"ui", "--nats", "nats://127.0.0.1:1", "--listen", "0.0.0.0:0"})
	require.Equal(t, exitUsage, code)
	require.Contains(t, a.stderr.String(), "JETCREW_UI_TOKEN")

	b := newTestApp(map[string]string{uiTokenEnv: "t0ken"}, nil)
	l, err := serveCmds{b.app}.consoleListener("0.0.0.0:0", true)
	require.NoError(t, err)
	_, port, _ := net.SplitHostPort(l.Addr().String())
	require.NotEmpty(t, port)
	require.NoError(t, l.Close())
}

// `up --auth` serves its console as the operator role, behind a token:
// with the token in the file it prints as
// JETCREW_UI_TOKEN_FILE=, every page, live stream and action works without
// a permissions violation (authUp's cleanup checks up's log for one);
// without it, nothing: no page, no CSRF token, no cancel. `ui` on a server
// that requires authentication refuses to serve without JETCREW_UI_TOKEN.
func TestUpAuthConsole(t *testing.T) {
	t.Parallel()
	e := authUp(t, "--ui", "127.0.0.1:0")
	var ui, tokenFile string
	require.Eventually(t, func() bool {
		m := uiURLLine.FindStringSubmatch(e.stdout.String())
		f := regexp.MustCompile(`(?m)^JETCREW_UI_TOKEN_FILE=(.+)$`).FindStringSubmatch(e.stdout.String())
		if m != nil && f != nil {
			ui, tokenFile = m[1], f[1]
		}
		return m != nil && f != nil
	}, 10*time.Second, 20*time.Millisecond, "stdout: %s", e.stdout.String())
	require.Equal(t, filepath.Join(e.data, authDirName, uiTokenFile), tokenFile)
	fi, err := os.Stat(tokenFile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	raw, err := os.ReadFile(tokenFile)
	require.NoError(t, err)
	token := strings.TrimSpace(string(raw))
	require.Len(t, token, 64)

	code, _, stderr := e.as(t, roles.Submitter, "submit", "--wait", "--id", "cs1", "exit 3")
	require.Equal(t, 3, code, stderr)
	code, _, stderr = e.as(t, roles.Submitter, "submit", "--id", "cs2", "sleep 1h")
	require.Equal(t, 0, code, stderr)

	// do sends one request with the token when bearer is set, never
	// following a redirect, and returns the status and (up to 64 KiB of)
	// the body.
	do := func(method, path string, form url.Values, bearer bool) (int, string) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		req, err := http.NewRequestWithContext(ctx, method, ui+strings.TrimPrefix(path, "/"), body)
		require.NoError(t, err)
		req.Header.Set("Accept", "text/html")
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		if bearer {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := noFollow.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		buf := make([]byte, 64<<10)
		n, _ := io.ReadAtLeast(resp.Body, buf, 1)
		return resp.StatusCode, string(buf[:n])
	}
	get := func(path string) string {
		code, body := do(http.MethodGet, path, nil, true)
		require.Equal(t, http.StatusOK, code, path)
		return body
	}
	require.Eventually(t, func() bool { return strings.Contains(get("/dead-letters"), "cs1") }, 10*time.Second, 50*time.Millisecond)
	overview := get("/")
	require.NotContains(t, overview, `class="alert"`, "the operator reads pools and workers")
	require.Contains(t, overview, "default")
	// cs2 has a state once a worker claimed it (the submitter writes none).
	require.Eventually(t, func() bool { return strings.Contains(get("/runs"), "cs2") }, 10*time.Second, 50*time.Millisecond)
	require.Contains(t, get("/runs/cs1"), "exit code 3")
	require.Contains(t, get("/live/run/cs1"), "event: ")
	// The conversation, which the operator reads from JETCREW_COORD's
	// mirror (JETCREW_COORD's consumers are the runs' inboxes, the
	// workers' alone).
	op := e.conn(t, roles.Operator)
	require.NoError(t, op.nc.Publish(coordination.SubjectFromOperator(coordtest.Group("cs1"), "cs1"), []byte("hello crew")))
	require.Eventually(t, func() bool { return readSSE(t, ui+"live/group/default/cs1", token, "hello crew") },
		10*time.Second, 50*time.Millisecond)
	get("/groups/default/cs1")
	page := get("/runs/cs2")
	csrf := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(page)
	require.NotNil(t, csrf)

	// Without the token: no page, no stream, no action, even with the
	// page's CSRF token.
	for _, path := range []string{"/", "/runs", "/runs/cs2", "/dead-letters", "/live/run/cs1", "/groups/default/cs1"} {
		code, body := do(http.MethodGet, path, nil, false)
		require.Contains(t, []int{http.StatusSeeOther, http.StatusUnauthorized}, code, path)
		require.NotContains(t, body, "cs1", path)
		require.NotContains(t, body, "cs2", path)
	}
	code, _ = do(http.MethodPost, "/runs/cs2/cancel", url.Values{"csrf": {csrf[1]}}, false)
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = do(http.MethodPost, "/runs/cs1/replay", url.Values{"csrf": {csrf[1]}}, false)
	require.Equal(t, http.StatusUnauthorized, code)
	_, stdout, _ := e.as(t, roles.Observer, "status", "cs2")
	require.Contains(t, stdout, "running", "nothing was cancelled")

	// The cancel button, as the browser posts it once logged in.
	code, _ = do(http.MethodPost, "/runs/cs2/cancel", url.Values{"csrf": {csrf[1]}}, true)
	require.Equal(t, http.StatusOK, code, "a cancel not confirmed asks first")
	code, _ = do(http.MethodPost, "/runs/cs2/cancel", url.Values{"csrf": {csrf[1]}, "confirm": {"yes"}}, true)
	require.Equal(t, http.StatusSeeOther, code, "redirected to the run's page")
	// A running run's cancel is answered "stopping"; the state says
	// cancelled once its container stopped, a moment later.
	require.Eventually(t, func() bool {
		code, stdout, _ := e.as(t, roles.Observer, "status", "cs2")
		return code == 0 && strings.Contains(stdout, "cancel")
	}, 10*time.Second, 50*time.Millisecond)

	// `ui` with the operator's credentials and no token of its own is
	// refused before it serves anything; with one, it requires it.
	code, _, stderr = e.as(t, roles.Operator, "ui", "--listen", "127.0.0.1:0")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "JETCREW_UI_TOKEN")
	ctx, cancel := context.WithCancel(t.Context())
	a := newTestApp(map[string]string{"XDG_CONFIG_HOME": e.xdg, "NATS_CONTEXT": "jetcrew-operator", uiTokenEnv: "ui-t0ken"}, nil)
	done := make(chan int, 1)
	go func() { done <- a.run(ctx, []string{"ui", "--listen", "127.0.0.1:0"}) }()
	require.Eventually(t, func() bool {
		m := uiURLLine.FindStringSubmatch(a.stdout.String())
		if m != nil {
			ui = m[1]
		}
		return m != nil
	}, 10*time.Second, 20*time.Millisecond, "stderr: %s", a.stderr.String())
	code, _ = do(http.MethodGet, "/runs", nil, false)
	require.Equal(t, http.StatusSeeOther, code, "to the login form")
	token = "ui-t0ken"
	require.Contains(t, get("/runs"), "cs2")
	cancel()
	require.Equal(t, 0, <-done, a.stderr.String())
}

// noFollow is an HTTP client that returns redirects instead of following
// them.
var noFollow = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// readSSE reads the event stream at url with the console's token for up to
// two seconds and reports whether want arrived.
func readSSE(t *testing.T, url, token, want string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := noFollow.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), want) {
			return true
		}
	}
	return false
}
