package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing/format/gitignore"
)

// entry is one file of a tree as walked: its slash-separated path relative
// to the tree's root and what Lstat said about it.
type entry struct {
	path string
	info fs.FileInfo
}

// walkOptions say which files of a tree walk keeps.
type walkOptions struct {
	// gitignore applies the tree's .gitignore files (and .git/info/exclude)
	// to files not in tracked.
	gitignore bool
	// tracked reports whether a path is tracked (kept even when ignored).
	tracked func(p string) bool
	// skip reports paths left out entirely (".git", the artifacts dir).
	skip func(p string, dir bool) bool
	// refuse, unless nil, reports paths whose names may not be kept
	// (asked after skip and the ignore rules): they are left out, a
	// directory with everything under it. It records them itself.
	refuse func(p string) bool
	// maxFiles bounds the number of entries; 0 means no bound.
	maxFiles int
}

// errTooManyFiles is returned by walk when a tree has more entries than
// walkOptions.maxFiles.
var errTooManyFiles = errors.New("too many files")

// walk lists the directories, regular files and symlinks of the tree at
// root, sorted by path (parents before children), without following any
// symlink. Other file types (sockets, FIFOs, devices) are left out. dir is
// root's host path, read through a bound file system for ignore patterns.
func walk(root *os.Root, dir string, o walkOptions) ([]entry, error) {
	var m gitignore.Matcher
	if o.gitignore {
		ps, err := gitignore.ReadPatterns(osfs.New(dir, osfs.WithBoundOS()), nil)
		if err != nil {
			return nil, fmt.Errorf("read ignore patterns: %w", err)
		}
		m = gitignore.NewMatcher(ps)
	}
	var out []entry
	var rec func(rel string) error
	rec = func(rel string) error {
		name := rel
		if name == "" {
			name = "."
		}
		f, err := root.Open(name)
		if err != nil {
			return err
		}
		des, err := f.ReadDir(-1)
		f.Close()
		if err != nil {
			return err
		}
		slices.SortFunc(des, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
		for _, de := range des {
			p := path.Join(rel, de.Name())
			t := de.Type()
			isDir := t.IsDir()
			if !isDir && !t.IsRegular() && t&fs.ModeSymlink == 0 {
				continue
			}
			if o.skip != nil && o.skip(p, isDir) {
				continue
			}
			if m != nil && m.Match(strings.Split(p, "/"), isDir) && !tracks(o.tracked, p, isDir) {
				continue
			}
			if o.refuse != nil && o.refuse(p) {
				continue
			}
			info, err := root.Lstat(p)
			if err != nil {
				return err
			}
			out = append(out, entry{path: p, info: info})
			if o.maxFiles > 0 && len(out) > o.maxFiles {
				return fmt.Errorf("%w: more than %d", errTooManyFiles, o.maxFiles)
			}
			if isDir {
				if err := rec(p); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := rec(""); err != nil {
		return nil, err
	}
	return out, nil
}

// tracks reports whether p is tracked or, for a directory, holds a tracked
// path.
func tracks(tracked func(string) bool, p string, dir bool) bool {
	if tracked == nil {
		return false
	}
	if dir {
		return tracked(p + "/")
	}
	return tracked(p)
}

// trackedSet returns a tracked function for paths: true for each path and,
// given "d/", for each directory holding one.
func trackedSet(paths []string) func(string) bool {
	set := make(map[string]bool, len(paths)*2)
	for _, p := range paths {
		set[p] = true
		for d := path.Dir(p); d != "." && !set[d+"/"]; d = path.Dir(d) {
			set[d+"/"] = true
		}
	}
	return func(p string) bool { return set[p] }
}
