package workertest

import (
	"io"
	"net"
	"net/http"
	"net/http/cgi"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// PushServer is a git smart-HTTP server on a loopback port, serving the
// bare repositories under Root through the machine's `git http-backend`,
// pushes included, to clients that authenticate as User with Token
// (HTTP basic auth); any other request gets 401.
type PushServer struct {
	// URL is the server's base URL; bare repository Root/NAME.git is at
	// URL + "/NAME.git".
	URL  string
	Root string
	// User and Token are the credentials the server accepts.
	User, Token string
}

// StartPushServer starts a PushServer accepting user and token, stopped
// when the test ends. It fails the test when git or its http-backend is
// missing.
func StartPushServer(t testing.TB, user, token string) *PushServer {
	t.Helper()
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatalf("git is needed for the git server: %v", err)
	}
	p := &PushServer{Root: t.TempDir(), User: user, Token: token}
	h := &cgi.Handler{Path: filepath.Join(strings.TrimSpace(string(out)), "git-http-backend"), Stderr: io.Discard,
		// REMOTE_USER set: http-backend takes pushes from authenticated
		// users only.
		Env: []string{"GIT_PROJECT_ROOT=" + p.Root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "REMOTE_USER=" + user}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, pw, ok := r.BasicAuth(); !ok || u != user || pw != token {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(l) }() // ends when Close closes the listener
	t.Cleanup(func() { _ = srv.Close() })
	p.URL = "http://" + l.Addr().String()
	return p
}

// NewBare creates the empty bare repository Root/NAME.git, its default
// branch main, and returns its path.
func (p *PushServer) NewBare(t testing.TB, name string) string {
	t.Helper()
	dir := filepath.Join(p.Root, name+".git")
	Git(t, p.Root, "init", "-q", "--bare", "-b", "main", dir)
	return dir
}
