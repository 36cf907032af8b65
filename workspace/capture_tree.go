package workspace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
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
// new commit of it on parent.
func commitWorkTree(st storer.EncodedObjectStorer, root *os.Root, dir string, parent plumbing.Hash, isGit bool, o CaptureOptions) (plumbing.Hash, error) {
	var parentTree plumbing.Hash
	var tracked []string
	if !parent.IsZero() {
		pc, err := object.GetCommit(st, parent)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		parentTree = pc.TreeHash
		t, err := pc.Tree()
		if err != nil {
			return plumbing.ZeroHash, err
		}
		_ = t.Files().ForEach(func(f *object.File) error { tracked = append(tracked, f.Name); return nil })
	}
	entries, err := walk(root, dir, walkOptions{
		gitignore: isGit, tracked: trackedSet(tracked), maxFiles: o.MaxFiles,
		skip: func(p string, _ bool) bool { return path.Base(p) == ".git" || underArtifacts(p) },
	})
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("walk the workspace: %w", err)
	}
	b := newTreeBuilder()
	var budget int64
	for _, e := range entries {
		switch {
		case e.info.IsDir():
			continue
		case e.info.Mode()&os.ModeSymlink != 0:
			target, err := root.Readlink(e.path)
			if err != nil {
				return plumbing.ZeroHash, err
			}
			h, err := storeBlob(st, int64(len(target)), func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(target)), nil }, nil)
			if err != nil {
				return plumbing.ZeroHash, err
			}
			b.add(e.path, filemode.Symlink, h)
		default:
			mode := filemode.Regular
			if e.info.Mode().Perm()&0o111 != 0 {
				mode = filemode.Executable
			}
			// A new object counts against the budget before it is stored
			// (held in memory while it is written): a file over the cap is
			// refused having been hashed only.
			h, err := storeBlob(st, e.info.Size(), func() (io.ReadCloser, error) {
				return root.OpenFile(e.path, os.O_RDONLY|syscallNoFollow|syscallNonBlock, 0)
			}, func() error {
				if budget += e.info.Size(); o.MaxBytes > 0 && budget > o.MaxBytes {
					return fmt.Errorf("%w: the run's changed files exceed %d bytes", ErrTooLarge, o.MaxBytes)
				}
				return nil
			})
			if errors.Is(err, ErrTooLarge) {
				return plumbing.ZeroHash, err
			}
			if err != nil {
				return plumbing.ZeroHash, fmt.Errorf("%s: %w", e.path, err)
			}
			b.add(e.path, mode, h)
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

// underArtifacts reports whether p is ArtifactsDir or inside it.
func underArtifacts(p string) bool {
	return p == messages.ArtifactsDir || strings.HasPrefix(p, messages.ArtifactsDir+"/")
}

// describe fills c's diffstat and patch, from the submitted tree to
// head's, and its commit count and bundle, base..head.
func (c *Captured) describe(st storer.EncodedObjectStorer, submitted, base, head plumbing.Hash, runID string) error {
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
