package workspace

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// maxSymlinkTarget bounds a symlink's target text read from a blob.
const maxSymlinkTarget = 4096

// snapshotCommit writes the snapshot of commit, HEAD of repo, to w: the
// .git buildGitDir makes of repo, then the commit's tree in the order walk
// lists a work tree (sorted by name, parents first), so the bytes equal
// those Snapshot writes for a clean clone of the commit. A submodule is an
// empty directory, as in a clone without --recurse-submodules. Names a
// tree may not hold ("", ".", "..", a '/' or NUL, duplicates) fail with
// ErrBadArchive; entries named .git are left out, as Snapshot does.
func snapshotCommit(repo *git.Repository, commit *object.Commit, w io.Writer, o RemoteOptions) (Info, error) {
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(w, h), max: o.MaxBytes}
	tw := newTarWriter(cw)
	gd, err := buildGitDir(repo, "")
	if err != nil {
		return Info{}, err
	}
	if err := gd.write(tw); err != nil {
		return Info{}, err
	}
	tree, err := commit.Tree()
	if err != nil {
		return Info{}, fmt.Errorf("%w: tree of %s: %w", ErrBadArchive, commit.Hash, err)
	}
	ct := &commitTree{tw: tw, maxFiles: o.MaxFiles}
	if err := ct.write(tree, ""); err != nil {
		return Info{}, err
	}
	if err := tw.close(); err != nil {
		return Info{}, err
	}
	return Info{
		Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), Size: cw.n,
		Git: true, Head: gd.head, Commits: gd.commits, Files: ct.files,
	}, nil
}

// commitTree writes the entries of a commit's tree to tw, counting them.
type commitTree struct {
	tw       *tarWriter
	maxFiles int
	files    int
}

// write writes tree's entries under dir ("" for the root), recursively.
func (c *commitTree) write(tree *object.Tree, dir string) error {
	entries := slices.Clone(tree.Entries)
	slices.SortFunc(entries, func(a, b object.TreeEntry) int { return strings.Compare(a.Name, b.Name) })
	for i, e := range entries {
		if e.Name == "" || e.Name == "." || e.Name == ".." || strings.ContainsAny(e.Name, "/\x00") ||
			i > 0 && entries[i-1].Name == e.Name {
			return fmt.Errorf("%w: tree %s holds an entry named %q", ErrBadArchive, tree.Hash, e.Name)
		}
		if e.Name == ".git" {
			continue
		}
		p := path.Join(dir, e.Name)
		if c.files++; c.maxFiles > 0 && c.files > c.maxFiles {
			return fmt.Errorf("%w: more than %d files", ErrTooLarge, c.maxFiles)
		}
		if err := c.entry(tree, e, p); err != nil {
			return err
		}
	}
	return nil
}

// entry writes one tree entry at path p.
func (c *commitTree) entry(tree *object.Tree, e object.TreeEntry, p string) error {
	switch e.Mode {
	case filemode.Dir:
		sub, err := tree.Tree(e.Name)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrBadArchive, p, err)
		}
		if err := c.tw.dir(p); err != nil {
			return err
		}
		return c.write(sub, p)
	case filemode.Submodule:
		return c.tw.dir(p)
	case filemode.Regular, filemode.Deprecated, filemode.Executable, filemode.Symlink:
	default:
		return fmt.Errorf("%w: %s has mode %s", ErrBadArchive, p, e.Mode)
	}
	f, err := tree.TreeEntryFile(&e)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrBadArchive, p, err)
	}
	r, err := f.Reader()
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrBadArchive, p, err)
	}
	defer r.Close()
	if e.Mode == filemode.Symlink {
		target, err := io.ReadAll(io.LimitReader(r, maxSymlinkTarget+1))
		if err != nil {
			return err
		}
		if len(target) > maxSymlinkTarget || strings.IndexByte(string(target), 0) >= 0 {
			return fmt.Errorf("%w: symlink %s has a target of more than %d bytes or a NUL", ErrBadArchive, p, maxSymlinkTarget)
		}
		return c.tw.symlink(p, string(target))
	}
	mode := int64(0o644)
	if e.Mode == filemode.Executable {
		mode = 0o755
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: p, Size: f.Size, Mode: mode, ModTime: epoch, Format: tar.FormatPAX}
	if err := c.tw.tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(c.tw.tw, r)
	if err == nil && n != f.Size {
		err = fmt.Errorf("%w: blob of %s has %d bytes, not %d", ErrBadArchive, p, n, f.Size)
	}
	return err
}
