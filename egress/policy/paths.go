package policy

import (
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"
)

// UnmeteredPaths are the requests on a metered host that a profile lets
// pass without usage while the run has a cost or token budget (profile key
// egress_unmetered_paths; ParseUnmeteredPaths). A nil value lists none.
type UnmeteredPaths struct {
	rules []pathRule
}

// pathRule is one entry: a method ("" for any) and a path, exact or, with
// prefix, any path below it.
type pathRule struct {
	entry  string
	method string
	path   string
	prefix bool
}

// pathMethods are the methods an entry may name.
var pathMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions}

// ParseUnmeteredPaths parses entries of the form "[METHOD ]PATH": METHOD
// is one of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS (absent: any);
// PATH starts with "/", is clean (no "//", "." or ".." segment), carries
// no query, no percent-encoding and no space, and either is exact
// ("/v1/embeddings") or ends in "/*" for every path below it
// ("/v1/files/*"). It returns an error naming the first entry that is not.
func ParseUnmeteredPaths(entries []string) (UnmeteredPaths, error) {
	var u UnmeteredPaths
	for _, e := range entries {
		r := pathRule{entry: e, path: e}
		if m, p, ok := strings.Cut(e, " "); ok {
			if !slices.Contains(pathMethods, m) {
				return UnmeteredPaths{}, fmt.Errorf("egress_unmetered_paths %q: method %q is not one of %s", e, m, strings.Join(pathMethods, ", "))
			}
			r.method, r.path = m, p
		}
		if p, ok := strings.CutSuffix(r.path, "/*"); ok {
			r.path, r.prefix = p+"/", true
		}
		check := strings.TrimSuffix(r.path, "/")
		if check == "" {
			check = "/"
		}
		if !strings.HasPrefix(r.path, "/") || strings.ContainsAny(r.path, "?#%* \t\r\n") || path.Clean(check) != check {
			return UnmeteredPaths{}, fmt.Errorf("egress_unmetered_paths %q: the path must start with /, be clean (no //, . or .. segment) and have no query, %%, space or * but a final /*", e)
		}
		u.rules = append(u.rules, r)
	}
	return u, nil
}

// Entries returns the entries as they were given, for the run's receipt.
func (u UnmeteredPaths) Entries() []string {
	var out []string
	for _, r := range u.rules {
		out = append(out, r.entry)
	}
	return out
}

// Match returns the entry that lists req, or "". A request whose path is
// not clean or is percent-encoded matches none: the host could read such
// a path as another one ("/v1/files/../chat/completions").
func (u UnmeteredPaths) Match(req *http.Request) string {
	p := req.URL.Path
	if !CleanPath(req) {
		return ""
	}
	for _, r := range u.rules {
		if r.method != "" && r.method != req.Method {
			continue
		}
		if p == r.path || (r.prefix && strings.HasPrefix(p, r.path) && len(p) > len(r.path)) {
			return r.entry
		}
	}
	return ""
}

// CleanPath reports whether req's path is as the host will read it: no
// percent-encoding, and no "//", "." or ".." segment.
func CleanPath(req *http.Request) bool {
	p := req.URL.Path
	if req.URL.RawPath != "" || !strings.HasPrefix(p, "/") {
		return false
	}
	c := strings.TrimSuffix(p, "/")
	if c == "" {
		return true
	}
	return path.Clean(c) == c
}
