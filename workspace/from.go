package workspace

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/filesystem"
)

// ErrNotGitSource is returned by DeriveSnapshot when the earlier run's
// snapshot is not a git work tree: its result cannot be rebuilt with a
// history.
var ErrNotGitSource = errors.New("the earlier run's workspace is not a git repository")

// ErrOutOfProportion is wrapped by DeriveSnapshot's error when the run's
// bundle holds an object whose declared size is out of proportion to its
// compressed bytes (MaxInflateRatio): a compression bomb, refused before
// it is stored or read, having been inflated only into its hash.
var ErrOutOfProportion = errors.New("an object inflates out of proportion to its compressed size")

// Bounds of the objects of a run's bundle that another run starts from
// (DeriveSnapshot), beside FromOptions.MaxBytes, their declared sizes
// summed.
const (
	// MaxInflateRatio is the most an object of a run's bundle may declare,
	// as a multiple of its compressed bytes in the bundle, once it
	// declares more than InflateRatioFloor. zlib, which git packs use,
	// reaches about 1000 on a run of one byte; source code and text stay
	// under 20.
	MaxInflateRatio = 100
	// InflateRatioFloor is the declared size, in bytes, up to which an
	// object of a run's bundle is not held to MaxInflateRatio.
	InflateRatioFloor = 1 << 20
)

// FromOptions bound DeriveSnapshot.
type FromOptions struct {
	// MaxBytes bounds, each in bytes: the objects of the earlier run's
	// snapshot and of its bundle once inflated (declared sizes, summed
	// before anything is inflated, as a git fetch's are), and the snapshot
	// written. 0 means no bound. Past it the error wraps ErrTooLarge.
	MaxBytes int64
	// MaxFiles bounds the entries of the tree; 0 means no bound.
	MaxFiles int
	// TempDir is where the objects are put together (a directory of its
	// own is made in it and removed); empty means os.TempDir().
	TempDir string
}

// DeriveSnapshot writes to w the snapshot of an earlier run's tree at its
// end, built from the snapshot it started from (base, a git work tree's
// snapshot) and its result bundle (written by Capture for run runID): a
// .git holding base's history and the run's commits, HEAD on base's branch
// (or detached, as base was) at the bundle's head — the run's head: its
// own commits and the commit Capture made of what it left uncommitted —
// and that commit's tree as the files (git status is clean). The bytes
// are those Snapshot writes of a clean work tree at that HEAD whose
// objects are stored as the inputs store them: equal inputs give equal
// bytes.
//
// The bundle's ref must be refs/heads/jetcrew/<runID> and its
// prerequisite base's HEAD. Info.Head is the bundle's head.
//
// base and bundle are hostile input, read as streams: object files are
// copied to disk as they are, the declared sizes of every object (each
// pack's, read before anything is inflated, and each loose object's
// header) are summed against MaxBytes first, the bundle's pack must hold
// no delta and no object out of proportion to its compressed bytes
// (MaxInflateRatio: ErrOutOfProportion), its pack is indexed one object
// at a time, streamed, and an object over 1 MiB is streamed from its pack
// whenever it is read, never held in memory whole. What stays in memory
// is the snapshot's .git (its pack, compressed, as Snapshot holds it).
func DeriveSnapshot(base io.Reader, bundle io.Reader, runID string, w io.Writer, o FromOptions) (Info, error) {
	dir, err := os.MkdirTemp(o.TempDir, "jetcrew-from-*")
	if err != nil {
		return Info{}, err
	}
	defer os.RemoveAll(dir)
	refs, err := readBaseGit(base, dir, o.MaxBytes)
	if err != nil {
		return Info{}, err
	}
	baseHead := refs.commit()
	branch, symbolic := strings.CutPrefix(refs.head, "ref: ")
	br := bufio.NewReaderSize(bundle, 64<<10)
	head, err := readDerivedBundle(br, dir, runID, baseHead, o.MaxBytes)
	if err != nil {
		return Info{}, err
	}
	st := filesystem.NewStorageWithOptions(osfs.New(dir, osfs.WithBoundOS()), cache.NewObjectLRU(fetchCacheBytes),
		filesystem.Options{ExclusiveAccess: true, LargeObjectThreshold: largeObjectBytes})
	defer st.Close()
	hc, err := object.GetCommit(st, head)
	if err != nil {
		return Info{}, fmt.Errorf("%w: the bundle's head %s: %w", ErrBadArchive, head, err)
	}
	if err := setDerivedHead(st, branch, symbolic, hc.Hash); err != nil {
		return Info{}, err
	}
	repo, err := git.Open(st, nil)
	if err != nil {
		return Info{}, err
	}
	// HEAD is hc now: the snapshot is the one a clean clone of it has.
	return snapshotCommit(repo, hc, w, RemoteOptions{MaxBytes: o.MaxBytes, MaxFiles: o.MaxFiles})
}

// readDerivedBundle reads run runID's bundle from r into dir (a .git
// directory: objects/pack/pack-<sum>.pack and its index) and returns its
// head. Its ref must be the run's and its prerequisite baseHead (none
// when baseHead is empty); its pack is checked and indexed from the file,
// streamed (indexPlainPack: no delta, no object out of proportion).
func readDerivedBundle(r *bufio.Reader, dir, runID, baseHead string, max int64) (plumbing.Hash, error) {
	prereqs, ref, head, _, err := readBundleHeader(r)
	if err != nil {
		return head, err
	}
	if want := plumbing.ReferenceName("refs/heads/jetcrew/" + runID); ref != want {
		return head, fmt.Errorf("%w: not the bundle of run %s: its ref is %q", ErrBadArchive, runID, ref)
	}
	switch {
	case len(prereqs) > 1:
		return head, fmt.Errorf("%w: the bundle has %d prerequisites", ErrBadArchive, len(prereqs))
	case len(prereqs) == 1 && prereqs[0].String() != baseHead:
		return head, fmt.Errorf("%w: the bundle's base %s is not the snapshot's HEAD %q", ErrBadArchive, prereqs[0], baseHead)
	case len(prereqs) == 0 && baseHead != "":
		return head, fmt.Errorf("%w: the bundle has no base, the snapshot's HEAD is %s", ErrBadArchive, baseHead)
	}
	packDir := filepath.Join(dir, "objects", "pack")
	f, err := os.CreateTemp(packDir, "bundle-*.tmp")
	if err != nil {
		return head, err
	}
	defer f.Close()
	if _, err := io.Copy(f, r); err != nil {
		return head, err
	}
	rules := packRules{max: max, ratio: MaxInflateRatio, ratioFloor: InflateRatioFloor, noDeltas: true}
	sum, err := indexPlainPack(f, packDir, rules)
	if err != nil {
		if !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrOutOfProportion) && !errors.Is(err, ErrBadArchive) {
			err = fmt.Errorf("%w: %w", ErrBadArchive, err)
		}
		return head, fmt.Errorf("the run's bundle: %w", err)
	}
	if err := f.Close(); err != nil {
		return head, err
	}
	return head, os.Rename(f.Name(), filepath.Join(packDir, "pack-"+sum.String()+".pack"))
}

// setDerivedHead points HEAD at own: on branch (a reference name) when
// symbolic, else detached. A zero own leaves the branch unborn.
func setDerivedHead(st *filesystem.Storage, branch string, symbolic bool, own plumbing.Hash) error {
	if !symbolic {
		if own.IsZero() {
			return fmt.Errorf("%w: a detached HEAD without a commit", ErrBadArchive)
		}
		return st.SetReference(plumbing.NewHashReference(plumbing.HEAD, own))
	}
	name := plumbing.ReferenceName(branch)
	if !name.IsBranch() {
		return fmt.Errorf("%w: HEAD names %q, not a branch", ErrBadArchive, branch)
	}
	if err := st.SetReference(plumbing.NewSymbolicReference(plumbing.HEAD, name)); err != nil {
		return err
	}
	if own.IsZero() {
		return nil
	}
	return st.SetReference(plumbing.NewHashReference(name, own))
}

// readBaseGit copies the object files of snapshot base's .git into
// dir/objects (packs with their indexes, loose objects), checking the
// sizes they declare against max (copyBaseObject), and returns its
// references (HEAD's line, "ref: refs/heads/main" or a commit id, and its
// branches, packed-refs included). A snapshot without .git is
// ErrNotGitSource.
func readBaseGit(base io.Reader, dir string, max int64) (snapshotRefs, error) {
	var refs snapshotRefs
	isGit := false
	var declared int64
	tr := tar.NewReader(base)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return refs, fmt.Errorf("%w: %w", ErrBadArchive, err)
		}
		name, err := cleanName(hdr.Name)
		if err != nil {
			return refs, err
		}
		rel, isObject := strings.CutPrefix(name, ".git/objects/")
		switch {
		case name == ".git":
			isGit = true
		case hdr.Typeflag == tar.TypeReg && isObject && objectFileRE.MatchString(rel):
			if err := copyBaseObject(io.LimitReader(tr, hdr.Size), dir, rel, max, &declared); err != nil {
				return refs, err
			}
		case isRefFile(name):
			if err := refs.read(tr, name); err != nil {
				return refs, err
			}
		}
	}
	if !isGit || refs.head == "" {
		return refs, ErrNotGitSource
	}
	if err := os.MkdirAll(filepath.Join(dir, "objects", "pack"), 0o700); err != nil {
		return refs, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "refs", "heads"), 0o700); err != nil {
		return refs, err
	}
	return refs, nil
}

// copyBaseObject copies object file rel of a snapshot's .git/objects from
// r into dir/objects, streamed, and checks what it declares: a pack's
// objects against max (checkPack), a loose object's size (its header)
// added to declared, which must stay within max (0: no bound).
func copyBaseObject(r io.Reader, dir, rel string, max int64, declared *int64) error {
	if err := copyObjectFile(nil, dir, rel, r); err != nil {
		return err
	}
	if strings.HasSuffix(rel, ".idx") {
		return nil
	}
	f, err := os.Open(filepath.Join(dir, "objects", filepath.FromSlash(rel)))
	if err != nil {
		return err
	}
	defer f.Close()
	if strings.HasSuffix(rel, ".pack") {
		if err := checkPack(f, max); err != nil {
			return fmt.Errorf("the earlier run's snapshot: %w", err)
		}
		return nil
	}
	_, size, err := peekHeaderFrom(f)
	if err != nil {
		return fmt.Errorf("%w: .git/objects/%s: %w", ErrBadArchive, rel, err)
	}
	if *declared += size; max > 0 && *declared > max {
		return fmt.Errorf("%w: the earlier run's loose objects exceed %d bytes inflated", ErrTooLarge, max)
	}
	return nil
}
