package bridge

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/jetcrew/jetcrew/coordination/relay"
)

// Claims and symlinks. A claimed pattern names paths of the workspace, and
// a symlink inside the workspace would give a claimed file a second name
// ("lnk/a.go" for "src/a.go" when lnk → src) that the group's overlap
// check, which compares names, cannot see. The bridge sees the workspace
// at /workspace (the worker does not: it is a volume the Docker engine
// mounts into the run's container), so it checks each pattern there before
// the claim leaves the container:
//
//   - the symlinks on a pattern's literal part (its segments up to the
//     first glob) are resolved, and the pattern is claimed, and released,
//     by the target's path: "lnk/a.go" is claimed as "src/a.go";
//   - a pattern whose literal part leads outside the workspace through a
//     symlink is refused;
//   - every other symlink the pattern covers or may pass through (a glob
//     matching it, a claimed directory holding it) must lead where the
//     pattern, or another pattern of the same call, covers by the target's
//     own path; else the claim is refused, naming the symlink. A symlink
//     leading outside the workspace names no file of it and is passed over.
//
// The check reads the workspace as it is at the claim: a symlink made
// afterwards is not seen. It lists at most maxClaimWalk directory entries
// per call; past that it stops looking (the claim goes on unchecked
// further). Claims are the agents' own declarations: an agent that calls
// the socket without its bridge skips this check, as it could skip
// claiming.

// Limits of the symlink check of claims.
const (
	// maxClaimWalk is the most directory entries one claim call lists.
	maxClaimWalk = 20000
	// maxLinkHops is the most symlinks resolved for one path, as Linux
	// allows (ELOOP past 40).
	maxLinkHops = 40
)

// claimWalker checks claimed patterns against a workspace (see above).
type claimWalker struct {
	root   *os.Root
	abs    string // the workspace's absolute path, for absolute symlinks
	budget int    // directory entries left to list
}

// resolveClaims returns paths (clean patterns) with the symlinks on their
// literal parts resolved against the workspace dir, repeats dropped; with
// check, it also refuses a set of patterns that reaches a path through a
// symlink none of them covers by the target's path. An empty dir, or one
// that cannot be opened, resolves nothing. The error is an
// *relay.InvalidError.
func resolveClaims(dir string, paths []string, check bool) ([]string, error) {
	return resolveClaimsWithin(dir, paths, check, maxClaimWalk)
}

// resolveClaimsWithin is resolveClaims listing at most budget directory
// entries.
func resolveClaimsWithin(dir string, paths []string, check bool, budget int) ([]string, error) {
	if dir == "" {
		return paths, nil
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return paths, nil
	}
	defer root.Close()
	abs, _ := filepath.Abs(dir)
	w := &claimWalker{root: root, abs: filepath.ToSlash(abs), budget: budget}
	out := make([]string, 0, len(paths))
	label := map[string]string{} // a resolved pattern as the agent gave it
	for _, p := range paths {
		r, outside, err := w.resolve(p)
		switch {
		case err != nil:
			return nil, refused(p, "goes through a symlink that cannot be followed: %v", err)
		case outside != "":
			return nil, refused(p, "goes through the symlink %q, which leads outside the workspace", outside)
		case r == "":
			r = "**" // a symlink to the workspace itself
		}
		if r, err = relay.ValidatePattern(r); err != nil {
			return nil, refused(p, "leads through symlinks to a path refused as a pattern: %v", err)
		}
		if !slices.Contains(out, r) {
			out = append(out, r)
			label[r] = fmt.Sprintf("%q", r)
			if r != p {
				label[r] = fmt.Sprintf("%q (%q through its symlinks)", p, r)
			}
		}
	}
	if check {
		for _, p := range out {
			if err := w.check(p, label[p], out); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// refused is a claim's refusal for pattern p.
func refused(p, format string, a ...any) error {
	return refusedAs(fmt.Sprintf("%q", p), format, a...)
}

// refusedAs is a claim's refusal for a pattern shown as label.
func refusedAs(label, format string, a ...any) error {
	return &relay.InvalidError{Code: relay.CodeInvalid,
		Message: "claim refused: " + label + " " + fmt.Sprintf(format, a...) + "; nothing was claimed"}
}

// resolve replaces the symlinks on p's literal part by their targets. It
// returns the resolved pattern ("" for the workspace itself), or the
// symlink that leads outside the workspace.
func (w *claimWalker) resolve(p string) (res, outside string, err error) {
	segs := splitPath(p)
	var done []string // the resolved part: real directories of the workspace
	for hops, i := 0, 0; i < len(segs); i++ {
		if isGlobSegment(segs[i]) {
			break
		}
		cand := path.Join(path.Join(done...), segs[i])
		fi, lerr := w.root.Lstat(cand)
		if lerr != nil || fi.Mode()&fs.ModeSymlink == 0 {
			if lerr != nil || !fi.IsDir() {
				// A new name, or a file: nothing further to resolve.
				return path.Join(append(done, segs[i:]...)...), "", nil
			}
			done = append(done, segs[i])
			continue
		}
		if hops++; hops > maxLinkHops {
			return "", "", fmt.Errorf("more than %d symlinks", maxLinkHops)
		}
		target, ok, err := w.target(cand)
		if err != nil {
			return "", "", err
		}
		if !ok {
			return "", cand, nil
		}
		// Start again from the target, which may hold symlinks itself.
		segs = append(splitPath(target), segs[i+1:]...)
		done, i = nil, -1
	}
	return path.Join(append(done, segs[len(done):]...)...), "", nil
}

// target returns the workspace path a symlink at name (a path of the
// workspace) leads to, lexically: ok is false when it leads outside.
func (w *claimWalker) target(name string) (string, bool, error) {
	t, err := w.root.Readlink(name)
	if err != nil {
		return "", false, err
	}
	t = filepath.ToSlash(t)
	if path.IsAbs(t) {
		rel, ok := strings.CutPrefix(path.Clean(t), w.abs)
		if !ok || rel != "" && !strings.HasPrefix(rel, "/") {
			return "", false, nil
		}
		t = "." + rel
	} else {
		t = path.Join(path.Dir(name), t)
	}
	t = path.Clean(t)
	if t == ".." || strings.HasPrefix(t, "../") {
		return "", false, nil
	}
	return t, true, nil
}

// check refuses p, a resolved pattern, when it reaches a path through a
// symlink that neither it nor another pattern of all covers by the
// target's path. It walks the directories p may reach, from its literal
// part down, within w.budget entries.
func (w *claimWalker) check(p, label string, all []string) error {
	m := newMatcher(p)
	s := m.start()
	if m.covered(s) {
		return nil // "**": it covers every target
	}
	dir := "."
	for _, seg := range m.segs {
		if isGlobSegment(seg) {
			break
		}
		s = m.step(s, seg)
		dir = path.Join(dir, seg)
	}
	if fi, err := w.root.Lstat(dir); err != nil || !fi.IsDir() {
		return nil // a file, or a name not made yet: nothing under it
	}
	return w.walk(label, m, dir, s, all)
}

// walk checks the entries under dir, reached in states s of m, the
// matcher of the pattern shown as label.
func (w *claimWalker) walk(label string, m matcher, dir string, s states, all []string) error {
	f, err := w.root.Open(dir)
	if err != nil {
		return nil
	}
	defer f.Close()
	for w.budget > 0 {
		entries, err := f.ReadDir(min(w.budget, 256))
		for _, e := range entries {
			w.budget--
			next := m.step(s, e.Name())
			if next == 0 {
				continue
			}
			name := path.Join(dir, e.Name())
			switch {
			case e.Type()&fs.ModeSymlink != 0:
				if err := w.checkLink(label, m, name, next, all); err != nil {
					return err
				}
			case e.IsDir():
				if err := w.walk(label, m, name, next, all); err != nil {
					return err
				}
			}
		}
		if err != nil { // io.EOF at the end
			return nil
		}
	}
	return nil
}

// checkLink checks the symlink at name, reached in states s of m: what the
// pattern covers through it, it must cover by the target's path too, or
// another pattern of all must cover the target whole. A symlink leading
// outside the workspace, or one that cannot be followed, names no file of
// the workspace and passes.
func (w *claimWalker) checkLink(label string, m matcher, name string, s states, all []string) error {
	t, outside, err := w.resolve(name)
	if err != nil || outside != "" {
		return nil
	}
	ts := splitPath(t)
	if s&^m.run(ts) == 0 {
		return nil
	}
	for _, q := range all {
		if qm := newMatcher(q); qm.covered(qm.run(ts)) {
			return nil
		}
	}
	return refusedAs(label, "reaches files through the symlink %q (to %q) that it does not cover by their own paths: "+
		"claim %q (or what you need of it) in the same call, or name the files by their targets' paths", name, cmpOr(t, "."), cmpOr(t, "**"))
}

// cmpOr is s, or def when s is empty or ".".
func cmpOr(s, def string) string {
	if s == "" || s == "." {
		return def
	}
	return s
}

// splitPath splits a clean workspace path into its segments ("." has none).
func splitPath(p string) []string {
	if p == "." || p == "" {
		return nil
	}
	return strings.Split(p, "/")
}

func isGlobSegment(s string) bool { return s == "**" || strings.ContainsAny(s, "*?[") }

// matcher matches paths against a pattern segment by segment, as claims
// cover them (relay.ValidatePattern, coordination.PatternsOverlap): state j
// means segs[:j] matched the path so far; state len(segs) means the path
// is covered, and so is everything under it.
type matcher struct{ segs []string }

// states is a set of a matcher's states, one bit each: a pattern has at
// most relay.MaxPatternSegments segments.
type states uint64

func newMatcher(p string) matcher { return matcher{segs: splitPath(p)} }

// start is the set of states before any name.
func (m matcher) start() states { return m.closure(1) }

// covered reports whether s holds the covered state.
func (m matcher) covered(s states) bool { return s&(1<<len(m.segs)) != 0 }

// closure adds to s the states a "**" reaches matching no name.
func (m matcher) closure(s states) states {
	for j, seg := range m.segs {
		if s&(1<<j) != 0 && seg == "**" {
			s |= 1 << (j + 1)
		}
	}
	return s
}

// step is the set of states after one more name.
func (m matcher) step(s states, name string) states {
	var n states
	for j := 0; j <= len(m.segs); j++ {
		if s&(1<<j) == 0 {
			continue
		}
		switch {
		case j == len(m.segs), m.segs[j] == "**":
			n |= 1 << j
		default:
			if ok, _ := path.Match(m.segs[j], name); ok {
				n |= 1 << (j + 1)
			}
		}
	}
	return m.closure(n)
}

// run is the set of states after the names of a path.
func (m matcher) run(names []string) states {
	s := m.start()
	for _, n := range names {
		s = m.step(s, n)
	}
	return s
}
