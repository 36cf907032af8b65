package workertest

import (
	"io"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// GitServer is a git smart-HTTP server on a loopback port, serving the
// repositories under Root through the machine's `git http-backend` (CGI).
// It counts the requests that fetch objects.
type GitServer struct {
	// URL is the server's base URL ("http://127.0.0.1:<port>"); a
	// repository Root/NAME is at URL + "/NAME".
	URL string
	// Root holds the served repositories.
	Root string
	// UploadPacks counts POST .../git-upload-pack requests: fetches of
	// objects (listing references does not count).
	UploadPacks atomic.Int64
	// Lists counts GET .../info/refs requests: reference listings.
	Lists atomic.Int64
	// MaxUploadPacksInFlight is the most fetches the server was serving at
	// once (counted from their arrival, the time held included).
	MaxUploadPacksInFlight atomic.Int64
	inFlight               atomic.Int64

	// holdLists and holdFetches are closed when the listings, and the
	// fetches, held by HoldListings and HoldFetches may go on (nil: none
	// held).
	holdLists, holdFetches atomic.Pointer[chan struct{}]
}

// StartGitServer starts a GitServer on a random loopback port, serving the
// repositories under a new directory, and stops it when the test ends. It
// fails the test when git or its http-backend is missing.
func StartGitServer(t testing.TB) *GitServer {
	t.Helper()
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatalf("git is needed for the git server: %v", err)
	}
	backend := filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	if _, err := os.Stat(backend); err != nil {
		t.Fatalf("git http-backend is needed for the git server: %v", err)
	}
	g := &GitServer{Root: t.TempDir()}
	h := &cgi.Handler{Path: backend, Stderr: io.Discard, Env: []string{"GIT_PROJECT_ROOT=" + g.Root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/git-upload-pack"):
			g.UploadPacks.Add(1)
			n := g.inFlight.Add(1)
			defer g.inFlight.Add(-1)
			for m := g.MaxUploadPacksInFlight.Load(); n > m && !g.MaxUploadPacksInFlight.CompareAndSwap(m, n); {
				m = g.MaxUploadPacksInFlight.Load()
			}
			wait(r, &g.holdFetches)
		case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/info/refs"):
			g.Lists.Add(1)
			wait(r, &g.holdLists)
		}
		h.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(l) }() // ends when Close closes the listener
	t.Cleanup(func() { _ = srv.Close() })
	g.URL = "http://" + l.Addr().String()
	return g
}

// HoldListings holds every reference listing that arrives from now on
// (counted in Lists on arrival) until release is called, and returns
// release. The test's end releases them too.
func (g *GitServer) HoldListings(t testing.TB) (release func()) { return hold(t, &g.holdLists) }

// HoldFetches holds every fetch that arrives from now on (counted in
// UploadPacks and MaxUploadPacksInFlight on arrival) until release is
// called, and returns release. The test's end releases them too.
func (g *GitServer) HoldFetches(t testing.TB) (release func()) { return hold(t, &g.holdFetches) }

func hold(t testing.TB, gate *atomic.Pointer[chan struct{}]) (release func()) {
	ch := make(chan struct{})
	gate.Store(&ch)
	release = sync.OnceFunc(func() {
		gate.CompareAndSwap(&ch, nil)
		close(ch)
	})
	t.Cleanup(release)
	return release
}

// wait holds request r while gate holds a channel that is still open.
func wait(r *http.Request, gate *atomic.Pointer[chan struct{}]) {
	if ch := gate.Load(); ch != nil {
		select {
		case <-*ch:
		case <-r.Context().Done():
		}
	}
}

// Git runs the git CLI in dir with a fixed identity and no user or system
// config, and returns its trimmed output; it fails the test on an error.
func Git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@x", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@x",
		"GIT_AUTHOR_DATE=2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE=2026-01-01T00:00:00Z")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// NewRepo makes a repository NAME under the server's Root with one commit
// on branch main holding files (path → content; a path ending in "*" is
// executable, the star dropped) and returns its work tree, where the test
// may commit more (the server serves it as it is).
func (g *GitServer) NewRepo(t testing.TB, name string, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(g.Root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	Git(t, dir, "init", "-q", "-b", "main")
	for p, content := range files {
		mode := os.FileMode(0o644)
		if s, ok := strings.CutSuffix(p, "*"); ok {
			p, mode = s, 0o755
		}
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	Git(t, dir, "add", "-A")
	Git(t, dir, "commit", "-qm", "first")
	return dir
}
