package workspace

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
)

// SnapshotOptions bound a snapshot.
type SnapshotOptions struct {
	// MaxBytes bounds the snapshot's size in bytes; 0 means no bound. A
	// larger tree fails with an error wrapping ErrTooLarge before the
	// snapshot is complete.
	MaxBytes int64
	// MaxFiles bounds the number of entries of the tree; 0 means no bound.
	MaxFiles int
	// CacheDir, when set, keeps the packed history of each HEAD snapshotted
	// and the list of its loose objects (see buildGitDir), so the next
	// snapshot of the same HEAD reads only the work tree and the loose
	// object files. Its files may be deleted at any time.
	CacheDir string
	// noDigest leaves Info.Digest empty, the bytes not hashed (a streamed
	// upload takes the put's digest).
	noDigest bool
}

// Info describes a snapshot.
type Info struct {
	// Digest is "sha256:<hex>" of the snapshot's bytes.
	Digest string
	// Size is the snapshot's length in bytes.
	Size int64
	// Git is true when the directory was a git work tree (the snapshot
	// then holds a .git directory).
	Git bool
	// Head is the commit HEAD named, for a git work tree with commits.
	Head string
	// Commits counts the commits reachable from Head that the snapshot
	// holds.
	Commits int
	// Files counts the tree's entries (directories, files, symlinks),
	// .git left out.
	Files int
}

// Stages are the durations of a snapshot's parts, for reports and
// benchmarks (Uploaded.Stages).
type Stages struct {
	// Git is opening the repository and reading its index (zero for a
	// plain directory).
	Git time.Duration
	// History is listing HEAD's history, reading its loose object files
	// and packing its other objects, with the index file (only the loose
	// files are read when SnapshotOptions.CacheDir had that HEAD).
	History time.Duration
	// Walk is listing the tree, ignore rules applied.
	Walk time.Duration
	// Write is reading the tree's files and writing the tar (.git
	// included) and its SHA-256 to the snapshot's writer.
	Write time.Duration
}

// Snapshot writes the snapshot of dir to w: an uncompressed tar whose bytes
// depend only on the tree's content (see docs/workspaces.md). When dir is a
// git work tree the snapshot holds what git would keep (tracked files,
// untracked files that are not ignored, uncommitted changes as they are on
// disk) and a fresh .git holding HEAD's history (the objects the
// repository stores loose as their files, copied as they are, the others as
// one pack: see buildGitDir), HEAD, its branch, an index matching HEAD and
// a minimal config (nothing of the repository's own config, hooks or other
// refs). Otherwise it holds the
// directory as it is. Only directories, regular files and symlinks are
// kept. It returns the snapshot's digest and size.
func Snapshot(dir string, w io.Writer, o SnapshotOptions) (Info, error) {
	return snapshot(dir, w, o, &Stages{})
}

// snapshot is Snapshot, setting took's durations.
func snapshot(dir string, w io.Writer, o SnapshotOptions, took *Stages) (Info, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Info{}, err
	}
	defer root.Close()
	var h hash.Hash
	cw := &countWriter{w: w, max: o.MaxBytes}
	if !o.noDigest {
		h = sha256.New()
		cw.w = io.MultiWriter(w, h)
	}
	tw := newTarWriter(cw)
	info := Info{}
	wo := walkOptions{maxFiles: o.MaxFiles, skip: func(p string, _ bool) bool { return path.Base(p) == ".git" }}
	gd, err := openGit(dir, &info, took, &wo, o.CacheDir)
	if err != nil {
		return Info{}, err
	}
	mark := time.Now()
	entries, err := walk(root, dir, wo)
	if err != nil {
		return Info{}, err
	}
	took.Walk = time.Since(mark)
	mark = time.Now()
	if gd != nil {
		if err := gd.write(tw); err != nil {
			return Info{}, err
		}
	}
	info.Files = len(entries)
	if err := writeEntries(tw, root, entries); err != nil {
		return Info{}, err
	}
	if err := tw.close(); err != nil {
		return Info{}, err
	}
	took.Write = time.Since(mark)
	info.Size = cw.n
	if h != nil {
		info.Digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	}
	return info, nil
}

// openGit opens the git repository of work tree dir, when it is one: it
// sets info's Git, Head and Commits and took's Git and History, makes wo
// apply the ignore rules (tracked files kept), and returns the snapshot's
// .git. A plain directory returns nil and no error.
func openGit(dir string, info *Info, took *Stages, wo *walkOptions, cacheDir string) (*gitDir, error) {
	start := time.Now()
	repo, err := git.PlainOpenWithOptions(dir, &git.PlainOpenOptions{EnableDotGitCommonDir: true})
	if errors.Is(err, git.ErrRepositoryNotExists) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open git repository %s: %w", dir, err)
	}
	info.Git = true
	tracked, err := indexPaths(repo)
	if err != nil {
		return nil, err
	}
	wo.gitignore, wo.tracked = true, trackedSet(tracked)
	took.Git = time.Since(start)
	start = time.Now()
	gd, err := buildGitDir(repo, cacheDir)
	if err != nil {
		return nil, err
	}
	took.History = time.Since(start)
	info.Head, info.Commits = gd.head, gd.commits
	return gd, nil
}

// writeEntries writes walked entries of root to tw.
func writeEntries(tw *tarWriter, root *os.Root, entries []entry) error {
	for _, e := range entries {
		var err error
		switch {
		case e.info.IsDir():
			err = tw.dir(e.path)
		case e.info.Mode()&os.ModeSymlink != 0:
			var target string
			if target, err = root.Readlink(e.path); err == nil {
				err = tw.symlink(e.path, target)
			}
		default:
			err = tw.file(root, e.path, e.info)
		}
		if err != nil {
			return fmt.Errorf("snapshot %s: %w", e.path, err)
		}
	}
	return nil
}

// indexPaths returns the paths in repo's index (staged files included).
func indexPaths(repo *git.Repository) ([]string, error) {
	idx, err := repo.Storer.Index()
	if err != nil {
		return nil, fmt.Errorf("read git index: %w", err)
	}
	out := make([]string, 0, len(idx.Entries))
	for _, e := range idx.Entries {
		out = append(out, e.Name)
	}
	return out, nil
}

// headRef returns the reference HEAD points at (a branch, or the commit of
// a detached HEAD) and the commit, or plumbing.ZeroHash for a repository
// without commits.
func headRef(repo *git.Repository) (plumbing.ReferenceName, plumbing.Hash, error) {
	sym, err := repo.Storer.Reference(plumbing.HEAD)
	if err != nil {
		return "", plumbing.ZeroHash, fmt.Errorf("read HEAD: %w", err)
	}
	ref, err := repo.Reference(plumbing.HEAD, true)
	if errors.Is(err, plumbing.ErrReferenceNotFound) {
		return sym.Target(), plumbing.ZeroHash, nil
	}
	if err != nil {
		return "", plumbing.ZeroHash, fmt.Errorf("resolve HEAD: %w", err)
	}
	if sym.Type() == plumbing.SymbolicReference {
		return sym.Target(), ref.Hash(), nil
	}
	return plumbing.HEAD, ref.Hash(), nil
}
