package workspace

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/storage/filesystem"

	"github.com/jetcrew/jetcrew/messages"
)

// CaptureOptions say what to capture and bound it.
type CaptureOptions struct {
	// RunID names the bundle's ref (refs/heads/jetcrew/<RunID>) and the
	// commit of uncommitted changes.
	RunID string
	// Snapshot is the host path of the snapshot tar the run started from.
	Snapshot string
	// Scratch is an empty host directory, private to the worker, that
	// Capture uses as its object store; the caller removes it.
	Scratch string
	// MaxBytes bounds the bytes of new file content read from the
	// workspace; 0 means no bound. Beyond it Capture fails with an error
	// wrapping ErrTooLarge.
	MaxBytes int64
	// MaxFiles bounds the entries of the workspace; 0 means no bound.
	MaxFiles int
}

// Captured is what a run changed: the result record (without Objects) and
// the contents of the result objects. Bundle is nil when the run made no
// change; Artifacts is nil when it left no artifacts.
type Captured struct {
	Result    messages.WorkspaceResult
	Patch     []byte
	Bundle    []byte
	Artifacts []byte
	// Session is the tar of the agent CLI's session files the run left
	// under messages.SessionDir (sessionTar); nil when none was kept.
	Session []byte
}

// captureAuthor signs the commit of changes a run left uncommitted.
var captureAuthor = object.Signature{Name: "jetcrew", Email: "jetcrew@localhost"}

// Capture records what the run changed in the workspace at dir relative to
// the snapshot it started from: the run's own commits (read from dir/.git
// with go-git, copied into Scratch), one more commit holding the work tree
// when it differs from the run's HEAD (what git would keep: ignored files
// left out, ArtifactsDir left out), the patch and diffstat from the base to
// that head, a bundle of the new commits and a tar of the artifacts. dir is
// read only through an os.Root, symlinks as their text, and only regular
// files, directories and symlinks are looked at. A path whose name cannot
// be held safely (treeRefuses; for artifacts a control character) is left
// out of all of these, the run's commits rewritten without it, and listed
// in the result's Refused (see messages.WorkspaceResult): it never fails
// the capture.
func Capture(dir string, o CaptureOptions) (*Captured, error) {
	b := loadCaptureBase(o)
	defer b.close()
	return b.capture(dir, o)
}

// captureBase is what a capture reads of the snapshot alone, before it
// looks at the tree: the store (the snapshot's object files copied into
// scratch, the submitted tree's objects), the base commit, the submitted
// tree, whether it is a git snapshot, the paths it refused, or why the
// snapshot could not be read. A capture container loads it while the run
// runs (preloadCapture), so the run's end waits for the tree alone.
type captureBase struct {
	fs              *filesystem.Storage
	st              *captureStore
	refused         refusedPaths
	base, submitted plumbing.Hash
	isGit           bool
	err             error
}

// loadCaptureBase reads the snapshot o.Snapshot into a store in o.Scratch
// (loadBase); a failure is kept in the result's err. The caller closes it.
func loadCaptureBase(o CaptureOptions) *captureBase {
	// The snapshot's packs stay open once read (a pack opened again for
	// each object read from it was most of the patch's time).
	fs := filesystem.NewStorageWithOptions(osfs.New(o.Scratch, osfs.WithBoundOS()), cache.NewObjectLRUDefault(),
		filesystem.Options{KeepDescriptors: true})
	b := &captureBase{fs: fs, st: newCaptureStore(fs, captureMemBytes), refused: refusedPaths{}}
	b.base, b.submitted, b.isGit, b.err = loadBase(b.st, o.Scratch, o.Snapshot, b.refused)
	return b
}

// close closes the files the store keeps open.
func (b *captureBase) close() { _ = b.fs.Close() }

// capture records what the run changed in the workspace at dir relative to
// the snapshot b was loaded from (see Capture). It changes b's store: one
// capture per captureBase.
func (b *captureBase) capture(dir string, o CaptureOptions) (*Captured, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	if b.err != nil {
		return nil, fmt.Errorf("read the submitted snapshot: %w", b.err)
	}
	st, refused, base, isGit := b.st, b.refused, b.base, b.isGit
	c := &Captured{}
	parent := base
	if isGit {
		var note string
		parent, note = copyRunCommits(st, dir, root, base, o.MaxBytes, refused)
		c.Result.Error = note
	}
	head, err := commitWorkTree(st, root, dir, parent, isGit, o, refused)
	if err != nil {
		return nil, err
	}
	if isGit {
		c.Result.Base = base.String()
	}
	c.Result.Head = head.String()
	if err := c.describe(st, b.submitted, base, head, o.RunID, refused); err != nil {
		return nil, err
	}
	if c.Artifacts, c.Result.Artifacts, err = artifacts(root, o.MaxBytes, refused); err != nil {
		return nil, err
	}
	c.Session, c.Result.SessionError = sessionTar(root, refused)
	refused.record(&c.Result)
	return c, nil
}

// loadBase loads the snapshot's objects into st: a git snapshot's pack and
// its work tree as a tree (the workspace as submitted, uncommitted changes
// included), or, for a plain directory, its tree as one commit. It returns
// the base commit (zero for a git snapshot of a repository without
// commits), the submitted tree and whether the snapshot was a git work
// tree.
//
// A git snapshot's object files (packs with their indexes, loose objects)
// are copied as they are into scratch's objects directory, where st finds
// them: nothing is decompressed or parsed until an object is needed. A
// work tree path treeRefuses is left out of the submitted tree and
// recorded in refused.
func loadBase(st *captureStore, scratch, snapshot string, refused refusedPaths) (base, submitted plumbing.Hash, isGit bool, err error) {
	z := plumbing.ZeroHash
	f, err := os.Open(snapshot)
	if err != nil {
		return z, z, false, err
	}
	defer f.Close()
	rd := &baseReader{st: st, scratch: scratch, refused: refused, tree: newTreeBuilder()}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return z, z, false, err
		}
		if err := rd.entry(tr, hdr); err != nil {
			return z, z, false, err
		}
	}
	if submitted, err = rd.tree.write(st); err != nil {
		return z, z, false, err
	}
	if rd.isGit {
		return rd.headCommit(), submitted, true, nil
	}
	// A fixed author and time: the base of a plain snapshot has one hash.
	sig := captureAuthor
	sig.When = epoch
	base, err = storeCommit(st, submitted, plumbing.ZeroHash, sig, "jetcrew: workspace as submitted")
	return base, submitted, false, err
}

// objectFileRE matches the object files of a .git that capture copies:
// packs, their indexes and loose objects, relative to .git/objects.
var objectFileRE = regexp.MustCompile(`^(pack/pack-[0-9a-f]{40}\.(pack|idx)|[0-9a-f]{2}/[0-9a-f]{38})$`)

// copyObjectFile copies one object file of a snapshot into scratch, and
// tells st of it (a nil st: nobody to tell).
func copyObjectFile(st *captureStore, scratch, rel string, r io.Reader) error {
	p := filepath.Join(scratch, "objects", filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		// Already there: a work tree file of the snapshot, read before
		// .git's objects (a hand-made tar's order), stored the same object.
		return nil
	}
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil || st == nil {
		return err
	}
	return st.addObjectFile(rel, p)
}

// baseReader is what loadBase gathers from a snapshot's entries: whether
// it is a git snapshot, its references (to find the base commit), and its
// work tree as a tree being built in st.
type baseReader struct {
	st      *captureStore
	scratch string
	refused refusedPaths
	isGit   bool
	refs    snapshotRefs
	tree    *treeBuilder
}

// entry takes one tar entry of the snapshot: an object file of .git is
// copied into scratch (copyObjectFile), HEAD and the references are read,
// the rest of .git is passed over, and a work tree file or symlink is
// stored in the tree (or refused, when treeRefuses its path).
func (rd *baseReader) entry(tr *tar.Reader, hdr *tar.Header) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	file := hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeSymlink
	rel, isObject := strings.CutPrefix(name, ".git/objects/")
	switch {
	case name == ".":
	case name == ".git":
		rd.isGit = true
	case hdr.Typeflag == tar.TypeReg && isObject && objectFileRE.MatchString(rel):
		return copyObjectFile(rd.st, rd.scratch, rel, tr)
	case isRefFile(name):
		return rd.refs.read(tr, name)
	case strings.HasPrefix(name, ".git/"):
	case file && refusedPrefix(name) != "":
		rd.refused.add(refusedPrefix(name))
	case file:
		return addTarEntry(rd.st, rd.tree, tr, hdr, name)
	}
	return nil
}

// headCommit returns the commit a git snapshot's HEAD names, through its
// branch when it names one; zero for a repository without commits.
func (rd *baseReader) headCommit() plumbing.Hash {
	if head := rd.refs.commit(); head != "" {
		return plumbing.NewHash(head)
	}
	return plumbing.ZeroHash
}

func addTarEntry(st storer.EncodedObjectStorer, b *treeBuilder, tr *tar.Reader, hdr *tar.Header, name string) error {
	mode := filemode.Regular
	var data []byte
	if hdr.Typeflag == tar.TypeSymlink {
		mode, data = filemode.Symlink, []byte(hdr.Linkname)
	} else {
		if hdr.Mode&0o111 != 0 {
			mode = filemode.Executable
		}
		var err error
		if data, err = io.ReadAll(tr); err != nil {
			return err
		}
	}
	h, err := storeBlob(st, int64(len(data)), func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, nil)
	if err != nil {
		return err
	}
	b.add(name, mode, h)
	return nil
}

// storeCommit writes a commit of tree (with parent unless zero) to st.
func storeCommit(st storer.EncodedObjectStorer, tree, parent plumbing.Hash, sig object.Signature, msg string) (plumbing.Hash, error) {
	c := &object.Commit{Author: sig, Committer: sig, Message: msg + "\n", TreeHash: tree}
	if !parent.IsZero() {
		c.ParentHashes = []plumbing.Hash{parent}
	}
	o := st.NewEncodedObject()
	if err := c.Encode(o); err != nil {
		return plumbing.ZeroHash, err
	}
	return st.SetEncodedObject(o)
}

// copyRunCommits returns the run's HEAD commit, its objects copied from the
// run's .git into st and its commits rewritten without the paths
// treeRefuses (recorded in refused; see sanitizer), or base when the run's
// repository cannot be read (the note then says why).
func copyRunCommits(st storer.EncodedObjectStorer, dir string, root *os.Root, base plumbing.Hash, max int64, refused refusedPaths) (plumbing.Hash, string) {
	fi, err := root.Lstat(".git")
	if err != nil || !fi.IsDir() {
		return base, "the run removed or replaced .git; its commits, if any, are lost (uncommitted changes are captured)"
	}
	run := filesystem.NewStorageWithOptions(osfs.New(path.Join(dir, ".git"), osfs.WithBoundOS()), cache.NewObjectLRUDefault(), filesystem.Options{})
	ref, err := storer.ResolveReference(run, plumbing.HEAD)
	if err != nil {
		if errors.Is(err, plumbing.ErrReferenceNotFound) {
			return base, ""
		}
		return base, "the run's HEAD cannot be read: " + err.Error()
	}
	head := ref.Hash()
	if head == base {
		return base, ""
	}
	copied, err := copyObjects(st, run, head, base, max)
	if err != nil {
		return base, "the run's commits cannot be read: " + err.Error()
	}
	if _, err := object.GetCommit(st, head); err != nil {
		return base, "the run's HEAD is not a commit: " + err.Error()
	}
	// Rewritten into a refusedPaths of its own: a failure loses none of
	// the paths the work tree's walk will refuse again.
	own := refusedPaths{}
	s, err := newSanitizer(st, base, copied, own)
	if err == nil {
		head, err = s.commit(head)
	}
	if err != nil {
		return base, "the run's commits cannot be read: " + err.Error()
	}
	maps.Copy(refused, own)
	return head, ""
}

// sinceEpoch stamps the commit of uncommitted changes.
var sinceEpoch = func() time.Time { return time.Now().UTC().Truncate(time.Second) }
