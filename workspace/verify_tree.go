package workspace

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/index"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// expected is what the snapshot holds at one path of the commit's tree.
type expected struct {
	mode filemode.FileMode
	hash plumbing.Hash
}

// expectedTree is the commit's tree, read from the snapshot's objects:
// entries the work tree must hold (path → entry), and blobs the index must
// list (every file and symlink, .git-named ones included, as the index of
// a snapshot lists them).
type expectedTree struct {
	g        *snapshotGit
	entries  map[string]expected
	blobs    map[string]expected
	files    int
	maxFiles int
}

// read reads tree h (hashed against h) at dir, and the trees below it.
// hidden is set below an entry named .git, which the work tree leaves out.
func (t *expectedTree) read(h plumbing.Hash, dir string, hidden bool) error {
	typ, data, err := t.g.object(h)
	if err != nil {
		return err
	}
	if typ != plumbing.TreeObject {
		return fmt.Errorf("object %s at %q is a %s, not a tree", h, cmpDir(dir), typ)
	}
	var tree object.Tree
	if err := tree.Decode(memoryObject(typ, data)); err != nil {
		return fmt.Errorf("tree %s: %w", h, err)
	}
	seen := map[string]bool{}
	for _, e := range tree.Entries {
		if e.Name == "" || e.Name == "." || e.Name == ".." || strings.ContainsAny(e.Name, "/\x00") || seen[e.Name] {
			return fmt.Errorf("tree %s holds an entry named %q", h, e.Name)
		}
		seen[e.Name] = true
		p := path.Join(dir, e.Name)
		if len(p) > maxVerifyPath {
			return fmt.Errorf("a path of the tree is longer than %d bytes", maxVerifyPath)
		}
		if t.files++; t.maxFiles > 0 && t.files > t.maxFiles {
			return fmt.Errorf("the tree has more than %d entries", t.maxFiles)
		}
		hide := hidden || e.Name == ".git"
		switch e.Mode {
		case filemode.Dir:
			if !hide {
				t.entries[p] = expected{e.Mode, e.Hash}
			}
			if err := t.read(e.Hash, p, hide); err != nil {
				return err
			}
			continue
		case filemode.Submodule:
		case filemode.Regular, filemode.Deprecated, filemode.Executable, filemode.Symlink:
			t.blobs[p] = expected{e.Mode, e.Hash}
		default:
			return fmt.Errorf("%s has mode %s", p, e.Mode)
		}
		if !hide {
			t.entries[p] = expected{e.Mode, e.Hash}
		}
	}
	return nil
}

func cmpDir(dir string) string {
	if dir == "" {
		return "."
	}
	return dir
}

// checkIndex checks that g's index lists exactly t's blobs, each with its
// mode and object.
func (t *expectedTree) checkIndex(g *snapshotGit) error {
	if g.index == nil {
		if len(t.blobs) == 0 {
			return nil
		}
		return errors.New("it has no .git/index")
	}
	var idx index.Index
	if err := index.NewDecoder(io.NewSectionReader(g.r, g.index.off, g.index.size)).Decode(&idx); err != nil {
		return fmt.Errorf(".git/index: %w", err)
	}
	if len(idx.Entries) != len(t.blobs) {
		return fmt.Errorf(".git/index lists %d files, the commit's tree %d", len(idx.Entries), len(t.blobs))
	}
	for _, e := range idx.Entries {
		if want, ok := t.blobs[e.Name]; !ok || e.Stage != 0 || e.Mode != want.mode || e.Hash != want.hash {
			return fmt.Errorf(".git/index lists %q, not as the commit's tree holds it", e.Name)
		}
	}
	return nil
}

// checkFiles reads r's tar again and compares every entry outside .git
// with t: each file's content hashed as a blob. A difference is a
// treeDiffers.
func (t *expectedTree) checkFiles(r io.ReaderAt, size int64) error {
	differs := func(format string, a ...any) error {
		return treeDiffers(fmt.Sprintf(format, a...))
	}
	matched := map[string]bool{}
	err := eachEntry(io.NewSectionReader(r, 0, size), 0, func(tr *tar.Reader, hdr *tar.Header, name string) error {
		if name == ".git" || strings.HasPrefix(name, ".git/") {
			return nil
		}
		want, ok := t.entries[name]
		if !ok {
			return differs("it holds %s, which the commit's tree does not", name)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if want.mode != filemode.Dir && want.mode != filemode.Submodule {
				return differs("%s is a directory, not as in the commit's tree", name)
			}
		case tar.TypeSymlink:
			if want.mode != filemode.Symlink || plumbing.ComputeHash(plumbing.BlobObject, []byte(hdr.Linkname)) != want.hash {
				return differs("symlink %s is not the commit's", name)
			}
		case tar.TypeReg:
			exec := hdr.Mode&0o111 != 0
			if want.mode != filemode.Regular && want.mode != filemode.Deprecated && want.mode != filemode.Executable ||
				exec != (want.mode == filemode.Executable) {
				return differs("file %s is not the commit's (type or mode)", name)
			}
			h := plumbing.NewHasher(plumbing.BlobObject, hdr.Size)
			if _, err := io.Copy(h, tr); err != nil {
				return err
			}
			if h.Sum() != want.hash {
				return differs("file %s is not the commit's", name)
			}
		default:
			return differs("%s is neither a directory, a file nor a symlink", name)
		}
		// A directory holding an entry is there, whether the tar names it
		// or not.
		for p := name; p != "." && !matched[p]; p = path.Dir(p) {
			matched[p] = true
		}
		return nil
	})
	if err != nil {
		return err
	}
	var lacks []string
	for p := range t.entries {
		if !matched[p] {
			lacks = append(lacks, p)
		}
	}
	if len(lacks) > 0 {
		return differs("it lacks %s, which the commit's tree holds", slices.Min(lacks))
	}
	return nil
}
