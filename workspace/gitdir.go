package workspace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/index"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/revlist"
	"github.com/go-git/go-git/v5/plumbing/storer"
)

// minimalConfig is the .git/config of every snapshot: nothing of the
// submitter's repository (remotes, hooks paths, filters, aliases) travels.
const minimalConfig = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"

// gitDir is the .git directory of a snapshot, built in memory: the loose
// object files it holds as they are, the pack of the other objects (none
// when packSum is empty) with its index, and the index file.
type gitDir struct {
	ref     plumbing.ReferenceName
	head    string
	commits int
	loose   []looseFile
	pack    []byte
	idx     []byte
	packSum string
	index   []byte
}

// buildGitDir builds the .git of a snapshot of repo: HEAD's history, and
// an index file matching HEAD's tree. The objects of that history stored
// loose in repo are kept as loose object files, their bytes copied as they
// are (nothing inflated but their headers); the others (in repo's packs,
// or all of them when more than maxLooseObjects are loose, or repo is not
// on disk) make one pack with its index (encodePack).
//
// With a cacheDir, the pack, its index, the index file and the list of
// loose objects of a HEAD are kept there (named by the HEAD commit) and
// reused by the next snapshot of the same HEAD while every listed loose
// object is still there: only the loose files and the work tree are read
// again.
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
	lo := openLooseDir(repo.Storer)
	defer lo.Close()
	if cacheDir != "" && gd.loadCache(cacheDir, lo) {
		return gd, nil
	}
	hashes, err := revlist.Objects(repo.Storer, []plumbing.Hash{head}, nil)
	if err != nil {
		return nil, fmt.Errorf("list history of %s: %w", head, err)
	}
	sizes, err := gd.storeObjects(repo.Storer, lo, hashes)
	if err != nil {
		return nil, err
	}
	commit, err := repo.CommitObject(head)
	if err != nil {
		return nil, err
	}
	if gd.index, err = headIndex(commit, sizes); err != nil {
		return nil, err
	}
	if cacheDir != "" {
		gd.saveCache(cacheDir)
	}
	return gd, nil
}

// storeObjects sets gd's loose files, pack and commit count for the
// objects hashes of s (lo: s's loose objects, nil when s is not on disk),
// and returns each object's size.
func (gd *gitDir) storeObjects(s storer.EncodedObjectStorer, lo *looseDir, hashes []plumbing.Hash) (map[plumbing.Hash]int64, error) {
	sizes := make(map[plumbing.Hash]int64, len(hashes))
	rest := hashes
	if lo != nil {
		var err error
		if gd.loose, rest, err = lo.readFiles(hashes, maxLooseObjects); err != nil {
			return nil, err
		}
	}
	for _, f := range gd.loose {
		sizes[f.hash] = f.size
		if f.typ == plumbing.CommitObject {
			gd.commits++
		}
	}
	if len(rest) == 0 {
		return sizes, nil
	}
	p, err := encodePack(s, rest)
	if err != nil {
		return nil, err
	}
	gd.pack, gd.idx, gd.packSum = p.pack, p.idx, p.sum
	gd.commits += p.commits
	maps.Copy(sizes, p.sizes)
	return sizes, nil
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
		files = append(files, file{".git/index", gd.index})
		if gd.packSum != "" {
			files = append(files,
				file{".git/objects/pack/pack-" + gd.packSum + ".idx", gd.idx},
				file{".git/objects/pack/pack-" + gd.packSum + ".pack", gd.pack},
			)
		}
		for _, f := range gd.loose {
			name := ".git/" + f.name()
			if d := path.Dir(name); !slices.Contains(dirs, d) {
				dirs = append(dirs, d)
			}
			files = append(files, file{name, f.data})
		}
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

// snapshotRefs are the references of a snapshot's .git as capture
// (loadBase) and DeriveSnapshot read them: HEAD's line, and the branches,
// each a file under .git/refs/heads or a line of .git/packed-refs (a file
// wins over a line).
type snapshotRefs struct {
	// head is .git/HEAD, trimmed: "ref: refs/heads/<branch>" or a commit id.
	head string
	// branches maps a ref name (refs/heads/...) to its commit id.
	branches map[string]string
}

// isRefFile reports whether a snapshot's entry name is one snapshotRefs
// reads: .git/HEAD, .git/packed-refs or a file under .git/refs/heads.
func isRefFile(name string) bool {
	return name == ".git/HEAD" || name == ".git/packed-refs" || strings.HasPrefix(name, ".git/refs/heads/")
}

// read reads the entry name (isRefFile) from r: at most 4 KiB of HEAD or
// a branch, at most 1 MiB of packed-refs.
func (s *snapshotRefs) read(r io.Reader, name string) error {
	if s.branches == nil {
		s.branches = map[string]string{}
	}
	if name == ".git/packed-refs" {
		v, err := io.ReadAll(io.LimitReader(r, 1<<20))
		if err != nil {
			return err
		}
		for line := range strings.SplitSeq(string(v), "\n") {
			if h, ref, ok := strings.Cut(line, " "); ok && len(h) == 40 && s.branches[ref] == "" {
				s.branches[ref] = h
			}
		}
		return nil
	}
	v, err := io.ReadAll(io.LimitReader(r, 4096))
	if err != nil {
		return err
	}
	if name == ".git/HEAD" {
		s.head = strings.TrimSpace(string(v))
	} else {
		s.branches[strings.TrimPrefix(name, ".git/")] = strings.TrimSpace(string(v))
	}
	return nil
}

// commit returns the commit id HEAD names, through its branch when it
// names one; "" when it names none (a repository without commits).
func (s *snapshotRefs) commit() string {
	if branch, ok := strings.CutPrefix(s.head, "ref: "); ok {
		return s.branches[branch]
	}
	return s.head
}
