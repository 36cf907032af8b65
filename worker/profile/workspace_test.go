package profile

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzAllowsGitRemote checks that a URL the allowlist https://git.example.com/org/*
// accepts is https, on that host, below /org/, with no dot segment, escape,
// credentials, query or fragment: nothing a fetch could read elsewhere.
func FuzzAllowsGitRemote(f *testing.F) {
	for _, s := range []string{"https://git.example.com/org/r.git", "https://git.example.com/org/../x", "https://git.example.com/org%2f..%2fx",
		"http://git.example.com/org/r", "https://git.example.com.evil/org/r", "https://u@git.example.com/org/r", "https://GIT.example.com/org/r"} {
		f.Add(s)
	}
	p := Profile{Name: "p", WorkspaceConfig: WorkspaceConfig{GitRemotes: []string{"https://git.example.com/org/*"}}}
	if err := p.validateGitRemotes(); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if !p.AllowsGitRemote(raw) {
			return
		}
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("allowed %q, which does not parse: %v", raw, err)
		}
		if u.Scheme != "https" || !strings.EqualFold(u.Host, "git.example.com") || u.User != nil || u.RawQuery != "" || u.Fragment != "" ||
			!strings.HasPrefix(u.EscapedPath(), "/org/") || hasDotSegment(u.Path) {
			t.Fatalf("allowed %q: scheme %q host %q path %q", raw, u.Scheme, u.Host, u.EscapedPath())
		}
	})
}
