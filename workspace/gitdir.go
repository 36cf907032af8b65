package workspace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/index"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/revlist"
)

// minimalConfig is the .git/config of every snapshot: nothing of the
// submitter's repository (remotes, hooks paths, filters, aliases) travels.
const minimalConfig = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"

// gitDir is the .git directory of a snapshot, built in memory.
type gitDir struct {
	ref     plumbing.ReferenceName
	head    string
	commits int
	pack    []byte
	idx     []byte
	packSum string
	index   []byte
}

// buildGitDir builds the .git of a snapshot of repo: HEAD's history as one
// pack with its index, and an index file matching HEAD's tree.
//
// With a cacheDir, the pack, its index and the index file of a HEAD are
// kept there (named by the HEAD commit) and reused by the next snapshot of
// the same HEAD: only the work tree is read again.
func buildGitDir(repo *git.Repository, cacheDir string) (*gitDir, error) {
	ref, head, err := headRef(repo)
	if err != nil {
		return nil, err
	}
	gd := &gitDir{ref: ref}
	if head.IsZero() {
		return gd, nil
	}
	gd.head = head.String()
	if cacheDir != "" && gd.loadCache(cacheDir) {
		return gd, nil
	}
	hashes, err := revlist.Objects(repo.Storer, []plumbing.Hash{head}, nil)
	if err != nil {
		return nil, fmt.Errorf("list history of %s: %w", head, err)
	}
	var p packed
	if p, err = encodePack(repo.Storer, hashes); err != nil {
		return nil, err
	}
	gd.pack, gd.idx, gd.packSum, gd.commits = p.pack, p.idx, p.sum, p.commits
	commit, err := repo.CommitObject(head)
	if err != nil {
		return nil, err
	}
	if gd.index, err = headIndex(commit, p.sizes); err != nil {
		return nil, err
	}
	if cacheDir != "" {
		gd.saveCache(cacheDir)
	}
	return gd, nil
}

// headIndex returns a git index (version 2) listing commit's tree, with
// zero stat data (git refreshes it on first use) but each file's size,
// taken from sizes (the blobs' sizes, as encodePack recorded them), so no
// blob is read again.
func headIndex(commit *object.Commit, sizes map[plumbing.Hash]int64) ([]byte, error) {
	tree, err := commit.Tree()
	if err != nil {
		return nil, err
	}
	idx := &index.Index{Version: 2}
	w := object.NewTreeWalker(tree, true, nil)
	defer w.Close()
	for {
		name, e, err := w.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if e.Mode == filemode.Dir || e.Mode == filemode.Submodule {
			continue
		}
		size, ok := sizes[e.Hash]
		if !ok {
			return nil, fmt.Errorf("blob %s of %s is not in the pack", e.Hash, name)
		}
		idx.Entries = append(idx.Entries, &index.Entry{
			Hash: e.Hash, Name: name, Mode: e.Mode, Size: uint32(size),
			CreatedAt: epoch, ModifiedAt: epoch,
		})
	}
	var b bytes.Buffer
	if err := index.NewEncoder(&b).Encode(idx); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// write writes the .git entries to tw.
func (gd *gitDir) write(tw *tarWriter) error {
	headLine := "ref: " + gd.ref.String() + "\n"
	if gd.ref == plumbing.HEAD {
		headLine = gd.head + "\n"
	}
	dirs := []string{".git", ".git/objects", ".git/objects/info", ".git/objects/pack", ".git/refs", ".git/refs/heads", ".git/refs/tags"}
	type file struct {
		name string
		data []byte
	}
	var files []file
	files = append(files, file{".git/HEAD", []byte(headLine)}, file{".git/config", []byte(minimalConfig)})
	if gd.head != "" {
		if gd.ref != plumbing.HEAD {
			rp := ".git/" + gd.ref.String()
			for d := path.Dir(rp); !slices.Contains(dirs, d); d = path.Dir(d) {
				dirs = append(dirs, d)
			}
			files = append(files, file{rp, []byte(gd.head + "\n")})
		}
		files = append(files,
			file{".git/index", gd.index},
			file{".git/objects/pack/pack-" + gd.packSum + ".idx", gd.idx},
			file{".git/objects/pack/pack-" + gd.packSum + ".pack", gd.pack},
		)
	}
	slices.SortFunc(dirs, strings.Compare)
	for _, d := range dirs {
		if err := tw.dir(d); err != nil {
			return err
		}
	}
	slices.SortFunc(files, func(a, b file) int { return strings.Compare(a.name, b.name) })
	for _, f := range files {
		if err := tw.bytes(f.name, f.data); err != nil {
			return err
		}
	}
	return nil
}
