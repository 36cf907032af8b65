package workspace

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// ErrWrongCommit means a snapshot does not hold the git commit it was
// taken for (VerifyCommit).
var ErrWrongCommit = errors.New("workspace snapshot does not hold commit")

// maxVerifyObject bounds the inflated size of a commit or tree object
// VerifyCommit reads.
const maxVerifyObject = 64 << 20

// maxVerifyPath bounds the length of a path in the commit's tree.
const maxVerifyPath = 4096

// VerifyCommit checks that the snapshot r (size bytes; a tar Scan has
// passed) is a snapshot of commit (40 hex digits) as Remote.Snapshot
// writes one, so that a run on it sees that commit and nothing else:
//
//   - its .git's HEAD names commit (on a branch, or detached), and the
//     object of that name, in its packs (index version 2, no deltas) or
//     loose, hashes to commit: the commit's own bytes;
//   - its files (everything outside .git) are that commit's tree: each
//     tree object read is hashed against the name its parent gives it,
//     each file's content hashed as a blob against its tree entry, the
//     executable bit and symlinks as the tree says, a submodule an empty
//     directory, entries named .git left out (as Snapshot writes them), no
//     file or directory the tree lacks and none missing;
//   - its .git holds nothing else that a run's git would read: the minimal
//     config, HEAD's branch as its only reference, object files, and an
//     index listing exactly the commit's tree;
//   - every object its .git holds hashes to its name (each one a pack
//     index lists, at the offset the index gives, and each loose file), so
//     the history a run's git reads, below commit, is made of genuine
//     objects (which objects are there is not checked: one missing is an
//     error to the run's git, never a lie).
//
// A snapshot that fails a check is ErrWrongCommit ("workspace snapshot
// does not hold commit C: why"); other errors are r's. It reads the
// snapshot's files once and its objects once more (each inflated as a
// stream into its hash, at most o.MaxBytes), then the commit and its trees
// again; it holds at most one commit or tree object (up to 64 MiB) at a
// time beside one entry per path of the tree. o.MaxFiles bounds the tree's
// entries.
func VerifyCommit(r io.ReaderAt, size int64, commit string, o UnpackOptions) error {
	wrong := func(format string, a ...any) error {
		return fmt.Errorf("%w %s: %s", ErrWrongCommit, commit, fmt.Sprintf(format, a...))
	}
	if len(commit) != 40 || strings.Trim(commit, "0123456789abcdef") != "" {
		return fmt.Errorf("commit %q is not 40 lowercase hex digits", commit)
	}
	want := plumbing.NewHash(commit)
	g, err := readSnapshotGit(r, size, o.MaxFiles)
	if err != nil {
		return err
	}
	if g.odd != "" {
		return wrong("its .git holds %s, which a snapshot of a commit never does", g.odd)
	}
	if !bytes.Equal(g.config, []byte(minimalConfig)) {
		return wrong("its .git/config is not the minimal one")
	}
	head, why := g.resolveHead()
	if why != "" {
		return wrong("%s", why)
	}
	if head != commit {
		return wrong("its HEAD is %s", head)
	}
	if err := g.checkObjects(o.MaxBytes); err != nil {
		return wrong("%v", err)
	}
	typ, data, err := g.object(want)
	if err != nil {
		return wrong("%v", err)
	}
	if typ != plumbing.CommitObject {
		return wrong("object %s is a %s", commit, typ)
	}
	var c object.Commit
	if err := c.Decode(memoryObject(typ, data)); err != nil {
		return wrong("commit %s: %v", commit, err)
	}
	tree := &expectedTree{g: g, entries: map[string]expected{}, blobs: map[string]expected{}, maxFiles: o.MaxFiles}
	if err := tree.read(c.TreeHash, "", false); err != nil {
		return wrong("%v", err)
	}
	if err := tree.checkFiles(r, size); err != nil {
		if d, ok := errors.AsType[treeDiffers](err); ok {
			return wrong("%s", string(d))
		}
		return err
	}
	if err := tree.checkIndex(g); err != nil {
		return wrong("%v", err)
	}
	return nil
}

// treeDiffers is what checkFiles found different, apart from read errors.
type treeDiffers string

func (d treeDiffers) Error() string { return string(d) }

// fileSpan is where a tar entry's data lies in the snapshot.
type fileSpan struct{ off, size int64 }

// snapshotGit is what VerifyCommit reads of a snapshot's .git: HEAD, the
// references, the config, and where the index and object files lie.
type snapshotGit struct {
	r      io.ReaderAt
	head   []byte
	refs   map[string]string
	config []byte
	index  *fileSpan
	packs  map[string]fileSpan // "pack-<hex>" → its .pack
	idxs   map[string]fileSpan // "pack-<hex>" → its .idx
	loose  map[plumbing.Hash]fileSpan
	// odd names the first .git entry a snapshot of a commit never holds.
	odd string
}

// packFileRE matches a pack or its index under .git/objects/pack.
var packFileRE = regexp.MustCompile(`^\.git/objects/pack/(pack-[0-9a-f]{40})\.(pack|idx)$`)

// looseFileRE matches a loose object file.
var looseFileRE = regexp.MustCompile(`^\.git/objects/([0-9a-f]{2})/([0-9a-f]{38})$`)

// readSnapshotGit reads the headers of r's tar, and the small files of
// its .git (HEAD, references, config).
func readSnapshotGit(r io.ReaderAt, size int64, maxFiles int) (*snapshotGit, error) {
	g := &snapshotGit{r: r, refs: map[string]string{}, packs: map[string]fileSpan{}, idxs: map[string]fileSpan{}, loose: map[plumbing.Hash]fileSpan{}}
	sr := io.NewSectionReader(r, 0, size)
	err := eachEntry(sr, maxFiles, func(tr *tar.Reader, hdr *tar.Header, name string) error {
		if name != ".git" && !strings.HasPrefix(name, ".git/") || hdr.Typeflag == tar.TypeDir {
			return nil
		}
		if hdr.Typeflag != tar.TypeReg {
			g.noteOdd(name)
			return nil
		}
		// archive/tar reads nothing ahead: the data starts here.
		off, err := sr.Seek(0, io.SeekCurrent)
		if err != nil {
			return err
		}
		span := fileSpan{off, hdr.Size}
		small := func() ([]byte, error) { return io.ReadAll(io.LimitReader(tr, 4096)) }
		switch m := packFileRE.FindStringSubmatch(name); {
		case m != nil && m[2] == "pack":
			g.packs[m[1]] = span
		case m != nil:
			g.idxs[m[1]] = span
		case looseFileRE.MatchString(name):
			lm := looseFileRE.FindStringSubmatch(name)
			g.loose[plumbing.NewHash(lm[1]+lm[2])] = span
		case name == ".git/index":
			g.index = &span
		case name == ".git/HEAD":
			g.head, err = small()
		case name == ".git/config":
			g.config, err = small()
		case strings.HasPrefix(name, ".git/refs/heads/"):
			var v []byte
			v, err = small()
			g.refs[strings.TrimPrefix(name, ".git/")] = strings.TrimSpace(string(v))
		default:
			g.noteOdd(name)
		}
		return err
	})
	return g, err
}

func (g *snapshotGit) noteOdd(name string) {
	if g.odd == "" {
		g.odd = name
	}
}

// resolveHead returns the commit HEAD names, or why it names none; HEAD's
// branch must be the only reference.
func (g *snapshotGit) resolveHead() (string, string) {
	head := strings.TrimSpace(string(g.head))
	if head == "" {
		return "", "it has no HEAD"
	}
	if ref, ok := strings.CutPrefix(head, "ref: "); ok {
		h, held := g.refs[ref]
		if !held {
			return "", fmt.Sprintf("its HEAD names %s, which it does not hold", ref)
		}
		head = h
		delete(g.refs, ref)
	}
	for ref := range g.refs {
		return "", fmt.Sprintf("it holds the reference %s beside HEAD's", ref)
	}
	return head, ""
}

// object returns the type and content of object h, found in a pack
// (through its index) or as a loose file, after checking that they hash
// to h.
func (g *snapshotGit) object(h plumbing.Hash) (plumbing.ObjectType, []byte, error) {
	for name, idx := range g.idxs {
		pack, ok := g.packs[name]
		if !ok {
			continue
		}
		off, found, err := packOffset(g.r, idx, h)
		if err != nil {
			return 0, nil, fmt.Errorf("%s.idx: %w", name, err)
		}
		if found {
			typ, data, err := readPackObject(g.r, pack, off)
			if err != nil {
				return 0, nil, fmt.Errorf("object %s in %s.pack: %w", h, name, err)
			}
			return typ, data, checkHash(h, typ, data)
		}
	}
	if span, ok := g.loose[h]; ok {
		typ, data, err := readLooseObject(g.r, span)
		if err != nil {
			return 0, nil, fmt.Errorf("loose object %s: %w", h, err)
		}
		return typ, data, checkHash(h, typ, data)
	}
	return 0, nil, fmt.Errorf("it holds no object %s", h)
}

func checkHash(h plumbing.Hash, typ plumbing.ObjectType, data []byte) error {
	if got := plumbing.ComputeHash(typ, data); got != h {
		return fmt.Errorf("the object stored as %s hashes to %s", h, got)
	}
	return nil
}
