package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// ErrAuthRequired is returned, wrapped, by CheckListen for an address
// beyond loopback when no token was given: the console offers cancel and
// replay, so it is never served to a network without authentication.
var ErrAuthRequired = errors.New("the console listens beyond loopback only with an auth token (environment variable JETCREW_UI_TOKEN)")

// contentSecurityPolicy lets a page load only the console's own script,
// style sheet and live streams: no inline script or style, no frames, no
// form posting elsewhere.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// maxFormBytes caps the body of a POST: a replay of maxReplayBatch run ids
// fits many times over.
const maxFormBytes = 256 << 10

// authCookie carries the auth token once a person has logged in.
const authCookie = "jetcrew_ui_token"

// CheckListen validates the console's listen address addr (host:port): a
// host that is not loopback (127.0.0.0/8, ::1, localhost) is refused with
// an error wrapping ErrAuthRequired when token is empty.
func CheckListen(addr, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("console listen address %q: %w", addr, err)
	}
	if isLoopback(host) || token != "" {
		return nil
	}
	return fmt.Errorf("console listen address %q: %w", addr, ErrAuthRequired)
}

// loopbackHost reports whether a request's Host header (host or
// host:port) names a loopback address.
func loopbackHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = strings.Trim(hostport, "[]")
	}
	return isLoopback(host)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// newCSRFToken returns a fresh random token for one console process: every
// form carries it, every POST must.
func newCSRFToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// guard holds the console's protections against other sites and users:
// security headers, the auth token and its login form, cross-origin
// protection and the CSRF token on every state-changing request, and the
// read-only switch and the server's refusals on every action
// (docs/console.md, "Security").
type guard struct {
	*core
	// refused hands the NATS server's refusals of an action's publish to
	// the action waiting on it.
	refused refusals
}

// secure wraps h with the console's protections: security headers on every
// response, the auth token (when set) on every request but the login form,
// and on state-changing requests Go's cross-origin protection
// (Sec-Fetch-Site, Origin) and the per-process CSRF token.
func (g *guard) secure(h http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "cross-origin request refused", http.StatusForbidden)
	}))
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
			if !equalToken(r.PostFormValue("csrf"), g.csrf) {
				http.Error(w, "missing or wrong CSRF token: reload the page", http.StatusForbidden)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
	protected := cop.Handler(inner)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", contentSecurityPolicy)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Cross-Origin-Opener-Policy", "same-origin")
		if g.cfg.Token == "" && !loopbackHost(r.Host) {
			// Without a token the console is loopback only; a page reached
			// under another host name is a DNS rebinding attempt.
			http.Error(w, "the console answers only to a loopback host name", http.StatusMisdirectedRequest)
			return
		}
		if g.cfg.Token != "" && !public(r.URL.Path) && !g.authorized(r) {
			if r.Method == http.MethodGet && strings.Contains(r.Header.Get("Accept"), "text/html") {
				http.Redirect(w, r, "/login", http.StatusSeeOther)
				return
			}
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		protected.ServeHTTP(w, r)
	})
}

// public reports whether path is served without the auth token: the login
// form and the embedded style sheet and script it uses (no data).
func public(path string) bool {
	return path == "/login" || strings.HasPrefix(path, "/static/")
}

// authorized reports whether r carries the auth token: as a bearer token or
// as the cookie /login sets.
func (g *guard) authorized(r *http.Request) bool {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && equalToken(tok, g.cfg.Token) {
		return true
	}
	ck, err := r.Cookie(authCookie)
	return err == nil && equalToken(ck.Value, g.cfg.Token)
}

func equalToken(got, want string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// login serves the login form (GET) and checks a submitted token (POST),
// setting an HttpOnly, SameSite=Strict cookie.
func (g *guard) login(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		if equalToken(r.PostFormValue("token"), g.cfg.Token) {
			http.SetCookie(w, &http.Cookie{
				Name: authCookie, Value: g.cfg.Token, Path: "/",
				HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
			})
			http.Redirect(w, r, "/", http.StatusSeeOther)
			return
		}
		g.renderStatus(w, r, http.StatusUnauthorized, "login", "layout", page{Title: "Log in", Data: true})
		return
	}
	g.render(w, r, "login", page{Title: "Log in"})
}

// action wraps the handler of a POST that changes state, which publishes
// to subjects (patterns with * and >): refused with 403 when the console is
// read only (Config.ReadOnly). The request's context is cancelled the moment
// the server refuses a publish to one of subjects, its cause a
// *refusedError that core.message shows with a 403.
func (g *guard) action(h http.HandlerFunc, subjects ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if g.cfg.ReadOnly {
			http.Error(w, "this console is read only", http.StatusForbidden)
			return
		}
		ctx, fail := context.WithCancelCause(r.Context())
		defer fail(nil)
		defer g.refused.watch(subjects, fail)()
		h(w, r.WithContext(ctx))
	}
}
