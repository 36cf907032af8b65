package workspace

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"

	"github.com/jetcrew/jetcrew/messages"
)

// A capture leaves out, and lists in the result (WorkspaceResult.Refused),
// every path whose name cannot be held safely, instead of failing on it:
// go-git refuses to check such a path out, to diff it or to write it into
// a patch, and a bundle holding a ".git"-like name would plant it in the
// submitter's repository. The rest of the run (its other files, its
// commits, its artifacts) is captured.

// hasControl reports whether s holds a C0 control character (0x00 to
// 0x1f) or DEL (0x7f).
func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// treeRefuses reports whether a commit's tree may not hold the
// slash-separated path p: a C0 control character or DEL anywhere, or a
// component git refuses to check out ("", "." or "..", ".git" in any case,
// or a spelling HFS+ or NTFS take for it, such as "git~1" or ".git."). The
// rule beside the control characters is go-git's own: object.Tree.FindEntry
// checks a path with it before looking anything up, so an empty tree
// answers "not found" for a path it accepts and another error for one it
// refuses.
func treeRefuses(p string) bool {
	if hasControl(p) {
		return true
	}
	_, err := (&object.Tree{}).FindEntry(p)
	return !errors.Is(err, object.ErrEntryNotFound) && !errors.Is(err, object.ErrDirectoryNotFound)
}

// refusedPrefix returns the shortest leading part of p (whole components)
// that treeRefuses, or "" when it refuses none: the path a refused
// directory is listed under.
func refusedPrefix(p string) string {
	for i := 0; i <= len(p); i++ {
		if i == len(p) || p[i] == '/' {
			if treeRefuses(p[:i]) {
				return p[:i]
			}
		}
	}
	return ""
}

// refusedPaths collects the paths a capture leaves out.
type refusedPaths map[string]bool

// add records p.
func (r refusedPaths) add(p string) { r[p] = true }

// record sets res.Refused (sorted, at most messages.MaxRefused) and
// res.RefusedCount, and says in res.Error that paths were left out.
func (r refusedPaths) record(res *messages.WorkspaceResult) {
	if len(r) == 0 {
		return
	}
	all := slices.Sorted(maps.Keys(r))
	res.RefusedCount = len(all)
	res.Refused = all[:min(len(all), messages.MaxRefused)]
	noun := "paths"
	if len(all) == 1 {
		noun = "path"
	}
	note := fmt.Sprintf("%d %s left out: their names hold a control character, or a component git will not check out (see refused)", len(all), noun)
	if res.Error != "" {
		note = res.Error + "; " + note
	}
	res.Error = note
}

// treeIndex lists every path of tree h in st with its entry, without
// go-git's path checks: a refused name (treeRefuses) is listed and not
// descended into. A zero h lists nothing.
func treeIndex(st storer.EncodedObjectStorer, h plumbing.Hash) (map[string]object.TreeEntry, error) {
	idx := map[string]object.TreeEntry{}
	if h.IsZero() {
		return idx, nil
	}
	var rec func(h plumbing.Hash, dir string, depth int) error
	rec = func(h plumbing.Hash, dir string, depth int) error {
		if depth > maxTreeDepth {
			return fmt.Errorf("tree %s is nested more than %d deep", h, maxTreeDepth)
		}
		t, err := object.GetTree(st, h)
		if err != nil {
			return err
		}
		for _, e := range t.Entries {
			p := joinPath(dir, e.Name)
			idx[p] = e
			if e.Mode == filemode.Dir && !treeRefuses(p) {
				if err := rec(e.Hash, p, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return idx, rec(h, "", 0)
}

// maxTreeDepth bounds how deep treeIndex and sanitizer descend (go-git's
// own tree walker stops at 1024).
const maxTreeDepth = 1024

// joinPath joins a tree entry's name to its directory's path ("" at the
// top) as it is: no cleaning, so ".." stays visible to treeRefuses.
func joinPath(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// sanitizer rewrites the run's commits so that no tree of theirs holds a
// path treeRefuses: such an entry takes the base's entry at the same path
// when the base has one (the base is never rewritten: it is the bundle's
// prerequisite), and is dropped otherwise. A commit whose tree and parents
// are unchanged keeps its id; a rewritten one keeps its author, committer,
// message and extra headers, but not its signature, which no longer holds.
type sanitizer struct {
	st storer.EncodedObjectStorer
	// base lists the base commit's tree (treeIndex).
	base map[string]object.TreeEntry
	// runs holds the commits copied from the run: only those are rewritten.
	runs    map[plumbing.Hash]bool
	commits map[plumbing.Hash]plumbing.Hash
	trees   map[treeAt]plumbing.Hash
	refused refusedPaths
}

// treeAt is a tree at a path: the same tree may be rewritten differently
// at two paths, as the base's entries differ.
type treeAt struct {
	h   plumbing.Hash
	dir string
}

// newSanitizer returns a sanitizer of the commits runs (copied from the
// run) on base, recording what it leaves out in refused.
func newSanitizer(st storer.EncodedObjectStorer, base plumbing.Hash, runs []plumbing.Hash, refused refusedPaths) (*sanitizer, error) {
	s := &sanitizer{st: st, runs: map[plumbing.Hash]bool{}, commits: map[plumbing.Hash]plumbing.Hash{}, trees: map[treeAt]plumbing.Hash{}, refused: refused}
	for _, h := range runs {
		s.runs[h] = true
	}
	var baseTree plumbing.Hash
	if !base.IsZero() {
		c, err := object.GetCommit(st, base)
		if err != nil {
			return nil, err
		}
		baseTree = c.TreeHash
	}
	var err error
	s.base, err = treeIndex(st, baseTree)
	return s, err
}

// commit returns h rewritten (h itself when nothing in it is refused, or
// when it is not one of the run's commits).
func (s *sanitizer) commit(h plumbing.Hash) (plumbing.Hash, error) {
	if !s.runs[h] {
		return h, nil
	}
	if nh, ok := s.commits[h]; ok {
		return nh, nil
	}
	c, err := object.GetCommit(s.st, h)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	tree, err := s.tree(c.TreeHash, "", 0)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	changed := tree != c.TreeHash
	parents := make([]plumbing.Hash, len(c.ParentHashes))
	for i, p := range c.ParentHashes {
		if parents[i], err = s.commit(p); err != nil {
			return plumbing.ZeroHash, err
		}
		changed = changed || parents[i] != p
	}
	if !changed {
		s.commits[h] = h
		return h, nil
	}
	nc := &object.Commit{
		Author: c.Author, Committer: c.Committer, MergeTag: c.MergeTag, Message: c.Message,
		TreeHash: tree, ParentHashes: parents, Encoding: c.Encoding,
	}
	for _, x := range c.ExtraHeaders {
		if !strings.HasPrefix(x.Key, "gpgsig") {
			nc.ExtraHeaders = append(nc.ExtraHeaders, x)
		}
	}
	o := s.st.NewEncodedObject()
	if err := nc.Encode(o); err != nil {
		return plumbing.ZeroHash, err
	}
	nh, err := s.st.SetEncodedObject(o)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	s.commits[h] = nh
	return nh, nil
}

// tree returns tree h at path dir rewritten. An entry equal to the base's
// at its path is kept without a look inside.
func (s *sanitizer) tree(h plumbing.Hash, dir string, depth int) (plumbing.Hash, error) {
	key := treeAt{h, dir}
	if nh, ok := s.trees[key]; ok {
		return nh, nil
	}
	if depth > maxTreeDepth {
		return plumbing.ZeroHash, fmt.Errorf("tree %s is nested more than %d deep", h, maxTreeDepth)
	}
	t, err := object.GetTree(s.st, h)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	out := make([]object.TreeEntry, 0, len(t.Entries))
	changed := false
	for _, e := range t.Entries {
		p := joinPath(dir, e.Name)
		b, inBase := s.base[p]
		switch {
		case inBase && b.Hash == e.Hash && b.Mode == e.Mode:
		case treeRefuses(p):
			s.refused.add(p)
			changed = true
			if !inBase {
				continue
			}
			e = b
		case e.Mode == filemode.Dir:
			nh, err := s.tree(e.Hash, p, depth+1)
			if err != nil {
				return plumbing.ZeroHash, err
			}
			changed = changed || nh != e.Hash
			e.Hash = nh
		}
		out = append(out, e)
	}
	nh := h
	if changed {
		if nh, err = storeTree(s.st, out); err != nil {
			return plumbing.ZeroHash, err
		}
	}
	s.trees[key] = nh
	return nh, nil
}

// storeTree stores a tree of entries, in git's order, and returns its hash.
func storeTree(s storer.EncodedObjectStorer, entries []object.TreeEntry) (plumbing.Hash, error) {
	slices.SortFunc(entries, func(a, c object.TreeEntry) int { return strings.Compare(treeSortKey(a), treeSortKey(c)) })
	o := s.NewEncodedObject()
	if err := (&object.Tree{Entries: entries}).Encode(o); err != nil {
		return plumbing.ZeroHash, err
	}
	return s.SetEncodedObject(o)
}

// treeSortKey is the key git orders a tree's entries by: the name, a
// directory's as if it ended with '/'.
func treeSortKey(e object.TreeEntry) string {
	if e.Mode == filemode.Dir {
		return e.Name + "/"
	}
	return e.Name
}
