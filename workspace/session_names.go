package workspace

import (
	"fmt"
	"path"
	"slices"
	"strings"
)

// SessionNames says which entries of the agent CLI's session directory a
// run keeps and a follow-up restores (profile.Plan's SessionKeep and
// SessionSkip; docs/backends.md, "Follow-ups"), by the name directly in
// the directory that each entry is or is under. exec applies it when it
// copies the directory and when it restores a session, and the worker
// when it stores the session object: a name a backend never keeps is
// never restored, whoever wrote it.
type SessionNames struct {
	// Keep, when not empty, lists path.Match patterns: only names
	// matching one are kept (Codex's CODEX_HOME holds its credentials and
	// configuration beside its sessions and state database).
	Keep []string
	// Skip lists names never kept: credentials, logs, downloaded binaries.
	Skip []string
}

// Kept reports whether the entry rel (slash-separated, relative to the
// session directory) is kept.
func (n SessionNames) Kept(rel string) bool {
	top, _, _ := strings.Cut(rel, "/")
	if slices.Contains(n.Skip, top) {
		return false
	}
	if len(n.Keep) == 0 {
		return true
	}
	for _, k := range n.Keep {
		if ok, _ := path.Match(k, top); ok {
			return true
		}
	}
	return false
}

// checkSessionName returns an error unless v is a name (or, for a keep
// pattern, a path.Match pattern) of one path component.
func checkSessionName(flag, v string, pattern bool) error {
	if v == "" || strings.Contains(v, "/") || v == "." || v == ".." {
		return fmt.Errorf("--%s %q: a name, not a path", flag, v)
	}
	if _, err := path.Match(v, ""); pattern && err != nil {
		return fmt.Errorf("--%s %q: %w", flag, v, err)
	}
	return nil
}
