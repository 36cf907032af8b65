package workspace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/diff"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/revlist"
	"github.com/go-git/go-git/v5/plumbing/storer"

	"github.com/jetcrew/jetcrew/messages"
)

// commitWorkTree stores the work tree at root as a tree (what git would
// keep when isGit) and returns parent when that tree is parent's, else a
// new commit of it on parent. A path treeRefuses is left out and recorded
// in refused; where parent holds an entry at that path (only the base can:
// the run's commits are rewritten without theirs), that entry is kept as
// it is.
func commitWorkTree(st storer.EncodedObjectStorer, root *os.Root, dir string, parent plumbing.Hash, isGit bool, o CaptureOptions, refused refusedPaths) (plumbing.Hash, error) {
	var parentTree plumbing.Hash
	if !parent.IsZero() {
		pc, err := object.GetCommit(st, parent)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		parentTree = pc.TreeHash
	}
	// Listed without go-git's path checks, which fail a whole listing on
	// one refused name.
	parentIdx, err := treeIndex(st, parentTree)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	entries, refusedHere, err := walkWorkTree(root, dir, isGit, parentIdx, o.MaxFiles, refused)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("walk the workspace: %w", err)
	}
	b := newTreeBuilder()
	for _, p := range refusedHere {
		switch e, ok := parentIdx[p]; {
		case !ok:
		case e.Mode == filemode.Dir:
			b.addTree(p, e.Hash)
		default:
			b.add(p, e.Mode, e.Hash)
		}
	}
	ws := &workTreeStore{st: st, root: root, max: o.MaxBytes}
	for _, e := range entries {
		if err := ws.add(b, e); err != nil {
			return plumbing.ZeroHash, err
		}
	}
	tree, err := b.write(st)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if tree == parentTree && !parent.IsZero() {
		return parent, nil
	}
	sig := captureAuthor
	sig.When = sinceEpoch()
	return storeCommit(st, tree, parent, sig, "jetcrew: changes run "+o.RunID+" left uncommitted")
}

// walkWorkTree lists the work tree at root as commitWorkTree keeps it
// (walk): .git, ArtifactsDir and SessionDir left out, the ignore rules
// applied when isGit to the paths parentIdx does not track, and each path
// treeRefuses left out, recorded in refused and returned.
func walkWorkTree(root *os.Root, dir string, isGit bool, parentIdx map[string]object.TreeEntry, maxFiles int, refused refusedPaths) ([]entry, []string, error) {
	var tracked, refusedHere []string
	for p, e := range parentIdx {
		if e.Mode != filemode.Dir && e.Mode != filemode.Submodule {
			tracked = append(tracked, p)
		}
	}
	entries, err := walk(root, dir, walkOptions{
		gitignore: isGit, tracked: trackedSet(tracked), maxFiles: maxFiles,
		skip: func(p string, _ bool) bool { return path.Base(p) == ".git" || underArtifacts(p) || underSession(p) },
		refuse: func(p string) bool {
			if !treeRefuses(p) {
				return false
			}
			refused.add(p)
			refusedHere = append(refusedHere, p)
			return true
		},
	})
	return entries, refusedHere, err
}

// workTreeStore stores a work tree's files as blobs in st, reading them
// through root, with a budget of max bytes of new content (0: none).
type workTreeStore struct {
	st     storer.EncodedObjectStorer
	root   *os.Root
	max    int64
	budget int64
}

// add stores e (a symlink's target, or a regular file's content, its
// executable bit kept) and adds it to b; a directory is passed over. A new
// file's size counts against the budget before it is stored (held in
// memory while it is written): a file over the cap is refused, with an
// error wrapping ErrTooLarge, having been hashed only.
func (w *workTreeStore) add(b *treeBuilder, e entry) error {
	switch {
	case e.info.IsDir():
		return nil
	case e.info.Mode()&os.ModeSymlink != 0:
		target, err := w.root.Readlink(e.path)
		if err != nil {
			return err
		}
		h, err := storeBlob(w.st, int64(len(target)), func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(target)), nil }, nil)
		if err != nil {
			return err
		}
		b.add(e.path, filemode.Symlink, h)
		return nil
	}
	mode := filemode.Regular
	if e.info.Mode().Perm()&0o111 != 0 {
		mode = filemode.Executable
	}
	h, err := storeBlob(w.st, e.info.Size(), func() (io.ReadCloser, error) {
		return w.root.OpenFile(e.path, os.O_RDONLY|syscallNoFollow|syscallNonBlock, 0)
	}, func() error {
		if w.budget += e.info.Size(); w.max > 0 && w.budget > w.max {
			return fmt.Errorf("%w: the run's changed files exceed %d bytes", ErrTooLarge, w.max)
		}
		return nil
	})
	if errors.Is(err, ErrTooLarge) {
		return err
	}
	if err != nil {
		return fmt.Errorf("%s: %w", e.path, err)
	}
	b.add(e.path, mode, h)
	return nil
}

// underArtifacts reports whether p is ArtifactsDir or inside it.
func underArtifacts(p string) bool {
	return p == messages.ArtifactsDir || strings.HasPrefix(p, messages.ArtifactsDir+"/")
}

// describe fills c's diffstat and patch, from the submitted tree to
// head's, and its commit count and bundle, base..head. A change of a path
// treeRefuses (a base's entry kept as it was, a submitted file left out)
// is left out of the patch and diffstat, and recorded in refused.
func (c *Captured) describe(st storer.EncodedObjectStorer, submitted, base, head plumbing.Hash, runID string, refused refusedPaths) error {
	hc, err := object.GetCommit(st, head)
	if err != nil {
		return err
	}
	if hc.TreeHash != submitted {
		from, err := object.GetTree(st, submitted)
		if err != nil {
			return err
		}
		to, err := hc.Tree()
		if err != nil {
			return err
		}
		changes, err := object.DiffTree(from, to)
		if err != nil {
			return err
		}
		changes = slices.DeleteFunc(changes, func(ch *object.Change) bool {
			for _, n := range []string{ch.From.Name, ch.To.Name} {
				if p := refusedPrefix(n); n != "" && p != "" {
					refused.add(p)
					return true
				}
			}
			return false
		})
		patch, err := changes.Patch()
		if err != nil {
			return err
		}
		c.stats(patch)
		var pb bytes.Buffer
		if err := encodePatch(&pb, patch, st); err != nil {
			return err
		}
		c.Patch = pb.Bytes()
	}
	if head == base {
		return nil
	}
	var ignore []plumbing.Hash
	if !base.IsZero() {
		ignore = []plumbing.Hash{base}
	}
	hashes, err := revlist.Objects(st, []plumbing.Hash{head}, ignore)
	if err != nil {
		return err
	}
	for _, h := range hashes {
		if o, err := st.EncodedObject(plumbing.CommitObject, h); err == nil && o.Type() == plumbing.CommitObject {
			c.Result.Commits++
		}
	}
	c.Bundle, err = bundle(st, hashes, base, head, runID)
	return err
}

// stats fills the diffstat of c.Result from patch.
func (c *Captured) stats(patch *object.Patch) {
	for _, fp := range patch.FilePatches() {
		from, to := fp.Files()
		name := ""
		if to != nil {
			name = to.Path()
		} else if from != nil {
			name = from.Path()
		}
		fs := messages.FileStat{Path: name, Binary: binaryChange(fp)}
		for _, ch := range fp.Chunks() {
			n := strings.Count(ch.Content(), "\n")
			if !strings.HasSuffix(ch.Content(), "\n") && ch.Content() != "" {
				n++
			}
			switch ch.Type() {
			case diff.Add:
				fs.Insertions += n
			case diff.Delete:
				fs.Deletions += n
			}
		}
		c.Result.FilesChanged++
		c.Result.Insertions += fs.Insertions
		c.Result.Deletions += fs.Deletions
		if len(c.Result.Files) < messages.MaxResultFiles {
			c.Result.Files = append(c.Result.Files, fs)
		}
	}
}

// bundle returns a git bundle (v2) of the objects hashes, with ref
// refs/heads/jetcrew/<runID> at head and base, when set, as prerequisite.
func bundle(st storer.EncodedObjectStorer, hashes []plumbing.Hash, base, head plumbing.Hash, runID string) ([]byte, error) {
	p, err := encodePack(st, hashes)
	if err != nil {
		return nil, err
	}
	pack := p.pack
	var b bytes.Buffer
	b.WriteString(bundleSignature)
	if !base.IsZero() {
		fmt.Fprintf(&b, "-%s jetcrew base\n", base)
	}
	fmt.Fprintf(&b, "%s refs/heads/jetcrew/%s\n\n", head, runID)
	b.Write(pack)
	return b.Bytes(), nil
}

// bundleSignature opens a version 2 git bundle.
const bundleSignature = "# v2 git bundle\n"
