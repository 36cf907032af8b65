package workspace

import (
	"archive/tar"
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/index"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/klauspost/compress/zlib"
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

// idxMagic opens a pack index of version 2.
var idxMagic = []byte{0xff, 't', 'O', 'c', 0, 0, 0, 2}

// packOffset looks h up in a pack index (version 2) and returns its offset
// in the pack. It reads the fan-out table and the names a binary search
// visits, nothing else of the index.
func packOffset(r io.ReaderAt, idx fileSpan, h plumbing.Hash) (int64, bool, error) {
	read := func(at int64, n int) ([]byte, error) {
		if at < 0 || at+int64(n) > idx.size {
			return nil, errors.New("truncated")
		}
		b := make([]byte, n)
		_, err := r.ReadAt(b, idx.off+at)
		return b, err
	}
	head, err := read(0, 8+256*4)
	if err != nil {
		return 0, false, err
	}
	if !bytes.Equal(head[:8], idxMagic) {
		return 0, false, errors.New("not a pack index of version 2")
	}
	fan := func(i int) int64 { return int64(binary.BigEndian.Uint32(head[8+4*i:])) }
	n := fan(255)
	const names = 8 + 256*4
	if names+28*n+40 > idx.size {
		return 0, false, errors.New("truncated")
	}
	lo, hi := int64(0), fan(int(h[0]))
	if h[0] > 0 {
		lo = fan(int(h[0]) - 1)
	}
	if lo > hi || hi > n {
		return 0, false, errors.New("its fan-out table is not sorted")
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		name, err := read(names+20*mid, 20)
		if err != nil {
			return 0, false, err
		}
		switch c := bytes.Compare(name, h[:]); {
		case c == 0:
			b, err := read(names+24*n+4*mid, 4)
			if err != nil {
				return 0, false, err
			}
			off := int64(binary.BigEndian.Uint32(b))
			if off&0x80000000 != 0 {
				if b, err = read(names+28*n+8*(off&0x7fffffff), 8); err != nil {
					return 0, false, err
				}
				off = int64(binary.BigEndian.Uint64(b) & (1<<63 - 1))
			}
			return off, true, nil
		case c < 0:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return 0, false, nil
}

// readPackObject reads the whole object at off of a pack: a commit, tree,
// blob or tag stored whole (a snapshot's pack holds no deltas), at most
// maxVerifyObject bytes once inflated.
func readPackObject(r io.ReaderAt, pack fileSpan, off int64) (plumbing.ObjectType, []byte, error) {
	if off < 12 || off >= pack.size {
		return 0, nil, fmt.Errorf("offset %d is outside the pack", off)
	}
	br := bufio.NewReader(io.NewSectionReader(r, pack.off+off, pack.size-off))
	typ, size, err := packEntryHeader(br)
	if err != nil {
		return 0, nil, err
	}
	data, err := inflate(br, size)
	return typ, data, err
}

// packEntryHeader reads a pack entry's header: the object's type and
// inflated size. A delta is refused: a snapshot's pack holds whole
// objects.
func packEntryHeader(br *bufio.Reader) (plumbing.ObjectType, int64, error) {
	b, err := br.ReadByte()
	if err != nil {
		return 0, 0, err
	}
	typ, size := plumbing.ObjectType((b>>4)&7), int64(b&15)
	for shift := 4; b&0x80 != 0; shift += 7 {
		if shift > 56 {
			return 0, 0, errors.New("malformed entry header")
		}
		if b, err = br.ReadByte(); err != nil {
			return 0, 0, err
		}
		size |= int64(b&0x7f) << shift
	}
	switch typ {
	case plumbing.CommitObject, plumbing.TreeObject, plumbing.BlobObject, plumbing.TagObject:
		return typ, size, nil
	case plumbing.OFSDeltaObject, plumbing.REFDeltaObject:
		return 0, 0, errors.New("stored as a delta, which a snapshot's pack never holds")
	default:
		return 0, 0, fmt.Errorf("entry of type %d", typ)
	}
}

// checkObjects hashes every object g's .git holds against its name, so
// whatever a run's git reads from it is what its name says: each object a
// pack's index lists, read at the offset the index gives (git reads it
// there), and each loose object file. Objects are inflated as streams
// into the hash, at most max bytes each (0: no bound); nothing is held.
func (g *snapshotGit) checkObjects(max int64) error {
	zr := &objectReader{}
	for name, idx := range g.idxs {
		pack, ok := g.packs[name]
		if !ok {
			continue // git reads nothing through an index without its pack
		}
		if err := zr.checkPack(g.r, idx, pack, max); err != nil {
			return fmt.Errorf("%s.pack: %w", name, err)
		}
	}
	for h, span := range g.loose {
		got, err := zr.hashLoose(g.r, span, max)
		if err != nil {
			return fmt.Errorf("loose object %s: %w", h, err)
		}
		if got != h {
			return fmt.Errorf("the object stored as %s hashes to %s", h, got)
		}
	}
	return nil
}

// objectReader inflates objects one after another, reusing its readers.
type objectReader struct {
	br *bufio.Reader
	z  io.ReadCloser
}

// inflater returns a zlib reader of r.
func (o *objectReader) inflater(r io.Reader) (io.Reader, error) {
	if o.z == nil {
		z, err := zlib.NewReader(r)
		o.z = z
		return z, err
	}
	return o.z, o.z.(zlib.Resetter).Reset(r, nil)
}

// hashStream hashes size bytes of r as an object of typ; fewer is an
// error.
func hashStream(r io.Reader, typ plumbing.ObjectType, size, max int64) (plumbing.Hash, error) {
	if max > 0 && size > max {
		return plumbing.ZeroHash, fmt.Errorf("%s of %d bytes, over the %d a snapshot may hold", typ, size, max)
	}
	h := plumbing.NewHasher(typ, size)
	if _, err := io.CopyN(h, r, size); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("shorter than the %d bytes it declares: %w", size, err)
	}
	return h.Sum(), nil
}

// checkPack hashes each object the index idx lists, read from pack at its
// offset, against its name.
func (o *objectReader) checkPack(r io.ReaderAt, idx, pack fileSpan, max int64) error {
	head := make([]byte, 8+256*4)
	if idx.size < int64(len(head)) {
		return errors.New("its index is truncated")
	}
	if _, err := r.ReadAt(head, idx.off); err != nil {
		return err
	}
	if !bytes.Equal(head[:8], idxMagic) {
		return errors.New("its index is not of version 2")
	}
	n := int64(binary.BigEndian.Uint32(head[8+4*255:]))
	const names = 8 + 256*4
	if names+28*n+40 > idx.size {
		return errors.New("its index is truncated")
	}
	nr := bufio.NewReader(io.NewSectionReader(r, idx.off+names, 20*n))
	or := bufio.NewReader(io.NewSectionReader(r, idx.off+names+24*n, 4*n))
	var name plumbing.Hash
	b := make([]byte, 8)
	for range n {
		if _, err := io.ReadFull(nr, name[:]); err != nil {
			return err
		}
		if _, err := io.ReadFull(or, b[:4]); err != nil {
			return err
		}
		off := int64(binary.BigEndian.Uint32(b))
		if off&0x80000000 != 0 {
			at := names + 28*n + 8*(off&0x7fffffff)
			if at+8 > idx.size {
				return errors.New("its index is truncated")
			}
			if _, err := r.ReadAt(b, idx.off+at); err != nil {
				return err
			}
			off = int64(binary.BigEndian.Uint64(b) & (1<<63 - 1))
		}
		if off < 12 || off >= pack.size {
			return fmt.Errorf("object %s: offset %d is outside the pack", name, off)
		}
		sr := io.NewSectionReader(r, pack.off+off, pack.size-off)
		if o.br == nil {
			o.br = bufio.NewReader(sr)
		} else {
			o.br.Reset(sr)
		}
		typ, size, err := packEntryHeader(o.br)
		if err != nil {
			return fmt.Errorf("object %s: %w", name, err)
		}
		z, err := o.inflater(o.br)
		if err != nil {
			return fmt.Errorf("object %s: %w", name, err)
		}
		got, err := hashStream(z, typ, size, max)
		if err != nil {
			return fmt.Errorf("object %s: %w", name, err)
		}
		if got != name {
			return fmt.Errorf("the object stored as %s hashes to %s", name, got)
		}
	}
	return nil
}

// hashLoose returns the name a loose object file's content hashes to.
func (o *objectReader) hashLoose(r io.ReaderAt, span fileSpan, max int64) (plumbing.Hash, error) {
	z, err := o.inflater(io.NewSectionReader(r, span.off, span.size))
	if err != nil {
		return plumbing.ZeroHash, err
	}
	br := bufio.NewReader(z)
	typ, size, err := looseHeader(br)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	return hashStream(br, typ, size, max)
}

// readLooseObject reads a loose object file: zlib of "<type> <size>\0"
// and the content.
func readLooseObject(r io.ReaderAt, span fileSpan) (plumbing.ObjectType, []byte, error) {
	z, err := zlib.NewReader(io.NewSectionReader(r, span.off, span.size))
	if err != nil {
		return 0, nil, err
	}
	defer z.Close()
	br := bufio.NewReader(z)
	typ, size, err := looseHeader(br)
	if err != nil {
		return 0, nil, err
	}
	data, err := readExactly(br, size)
	return typ, data, err
}

// inflate reads a zlib stream of size bytes once inflated.
func inflate(r io.Reader, size int64) ([]byte, error) {
	z, err := zlib.NewReader(r)
	if err != nil {
		return nil, err
	}
	defer z.Close()
	return readExactly(z, size)
}

// readExactly reads the size bytes an object declares, at most
// maxVerifyObject.
func readExactly(r io.Reader, size int64) ([]byte, error) {
	if size > maxVerifyObject {
		return nil, fmt.Errorf("%d bytes, over the %d a commit or tree may have here", size, maxVerifyObject)
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(r, data); err != nil {
		return nil, fmt.Errorf("shorter than the %d bytes it declares: %w", size, err)
	}
	return data, nil
}

func memoryObject(typ plumbing.ObjectType, data []byte) plumbing.EncodedObject {
	o := &plumbing.MemoryObject{}
	o.SetType(typ)
	o.SetSize(int64(len(data)))
	_, _ = o.Write(data)
	return o
}

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
