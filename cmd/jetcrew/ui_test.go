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

	"github.com/stretchr/testify/require"

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
	a := newTestApp(nil, nil)
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
	l, err := b.consoleListener("0.0.0.0:0", true)
	require.NoError(t, err)
	_, port, _ := net.SplitHostPort(l.Addr().String())
	require.NotEmpty(t, port)
	require.NoError(t, l.Close())
}

// `up --auth` serves its console as the operator role: every page, live
// stream and action works without a permissions violation (authUp's
// cleanup checks up's log for one).
func TestUpAuthConsole(t *testing.T) {
	t.Parallel()
	e := authUp(t, "--ui", "127.0.0.1:0")
	var ui string
	require.Eventually(t, func() bool {
		m := uiURLLine.FindStringSubmatch(e.stdout.String())
		if m != nil {
			ui = m[1]
		}
		return m != nil
	}, 10*time.Second, 20*time.Millisecond)
	code, _, stderr := e.as(t, roles.Submitter, "submit", "--wait", "--id", "cs1", "exit 3")
	require.Equal(t, 3, code, stderr)
	code, _, stderr = e.as(t, roles.Submitter, "submit", "--id", "cs2", "sleep 1h")
	require.Equal(t, 0, code, stderr)

	get := func(path string, stream bool) string {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, ui+path, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		buf := make([]byte, 64<<10)
		n, _ := io.ReadAtLeast(resp.Body, buf, 1)
		if !stream {
			rest, _ := io.ReadAll(resp.Body)
			return string(buf[:n]) + string(rest)
		}
		return string(buf[:n])
	}
	require.Eventually(t, func() bool { return strings.Contains(get("/dead-letters", false), "cs1") }, 10*time.Second, 50*time.Millisecond)
	overview := get("/", false)
	require.NotContains(t, overview, `class="alert"`, "the operator reads pools and workers")
	require.Contains(t, overview, "default")
	require.Contains(t, get("/runs", false), "cs2")
	require.Contains(t, get("/runs/cs1", false), "exit code 3")
	require.Contains(t, get("/live/run/cs1", true), "event: ")
	get("/live/group/cs1", true)
	get("/groups/cs1", false)

	// The cancel button, as the browser posts it.
	page := get("/runs/cs2", false)
	csrf := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(page)
	require.NotNil(t, csrf)
	resp, err := http.PostForm(ui+"runs/cs2/cancel", map[string][]string{"csrf": {csrf[1]}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "redirected to the run's page")
	code, stdout, _ := e.as(t, roles.Observer, "status", "cs2")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "cancel")
}
