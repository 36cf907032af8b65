package workspace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/go-git/go-billy/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/klauspost/compress/zlib"
)

// looseObjects reads a repository's loose objects straight from their
// files (objects/xx/yyyy…: zlib of "<type> <size>\0<content>") into pack
// entries, without go-git's object cache, its in-memory copy of each object
// and the collision-detecting SHA-1 it computes over each (and never
// compares with the name either). Exactly the size the header declares is
// copied; a shorter stream is an error. zlibReaders keeps the readers for
// reuse.
type looseObjects struct {
	fs billy.Filesystem
}

// newLooseObjects returns the loose objects of s when s is a repository on
// disk (go-git's filesystem storage), else nil.
func newLooseObjects(s storer.EncodedObjectStorer) *looseObjects {
	type onDisk interface{ Filesystem() billy.Filesystem }
	d, ok := s.(onDisk)
	if !ok || d.Filesystem() == nil {
		return nil
	}
	return &looseObjects{fs: d.Filesystem()}
}

// copyObject writes the pack entry of loose object h (header, then its
// content compressed by enc) to w and returns its type and size. ok is
// false, with no error and nothing written, when h is not a loose object.
func (l *looseObjects) copyObject(h plumbing.Hash, w *bytes.Buffer, enc *entryEncoder) (t plumbing.ObjectType, size int64, ok bool, err error) {
	hx := h.String()
	f, err := l.fs.Open(l.fs.Join("objects", hx[:2], hx[2:]))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, 0, false, nil
	}
	if err != nil {
		return 0, 0, false, err
	}
	defer f.Close()
	zr, err := openZlib(f)
	if err != nil {
		return 0, 0, true, fmt.Errorf("loose object: %w", err)
	}
	defer zlibReaders.Put(zr)
	if enc.br == nil {
		enc.br = bufio.NewReaderSize(zr, 32<<10)
	} else {
		enc.br.Reset(zr)
	}
	if t, size, err = looseHeader(enc.br); err != nil {
		return 0, 0, true, err
	}
	writeEntryHeader(w, t, size)
	return t, size, true, enc.compress(w, enc.br, size)
}

// openZlib returns a zlib reader of r, reused from zlibReaders when one is
// there. klauspost/compress inflates the same bytes as compress/zlib, about
// 1.3-1.5 times as fast here (inflating is most of packing loose objects).
func openZlib(r io.Reader) (io.ReadCloser, error) {
	if zr, ok := zlibReaders.Get().(io.ReadCloser); ok {
		if err := zr.(zlib.Resetter).Reset(r, nil); err != nil {
			return nil, err
		}
		return zr, nil
	}
	return zlib.NewReader(r)
}

// looseHeader reads a loose object's "<type> <size>\0" header.
func looseHeader(br *bufio.Reader) (plumbing.ObjectType, int64, error) {
	line, err := br.ReadSlice(0)
	if err != nil {
		return 0, 0, fmt.Errorf("loose object header: %w", err)
	}
	typ, sz, found := bytes.Cut(line[:len(line)-1], []byte{' '})
	if !found {
		return 0, 0, fmt.Errorf("loose object header %q", line)
	}
	t, err := plumbing.ParseObjectType(string(typ))
	if err != nil {
		return 0, 0, fmt.Errorf("loose object header: %w", err)
	}
	size, err := strconv.ParseInt(string(sz), 10, 64)
	if err != nil || size < 0 {
		return 0, 0, fmt.Errorf("loose object header %q", line)
	}
	return t, size, nil
}

// zlibReaders keeps zlib readers for reuse (each holds a 32 KiB window).
var zlibReaders sync.Pool

// maxLooseObjects is the most objects a snapshot's .git holds as loose
// object files: a history with more loose objects reachable from HEAD is
// packed whole instead (buildGitDir), so the worker's entry cap (200,000)
// and the unpack's file count stay far away. Git itself packs loose
// objects from 6,700 on (gc.auto).
var maxLooseObjects = 10000

// minLooseFileBytes is the smallest loose object file a snapshot's .git
// holds as it is; smaller loose objects go into the pack. A tar entry
// costs 512 bytes of header and pads its file to 512 bytes, about a small
// object's own size, while inflating and compressing one again costs
// little.
const minLooseFileBytes = 2048

// looseFile is one loose object file of a repository: its bytes as they
// are on disk (zlib of "<type> <size>\0<content>", never inflated whole),
// and the type and size its header declares.
type looseFile struct {
	hash plumbing.Hash
	data []byte
	typ  plumbing.ObjectType
	size int64
}

// name is the file's path in a .git: objects/xx/yyyy….
func (f looseFile) name() string {
	hx := f.hash.String()
	return "objects/" + hx[:2] + "/" + hx[2:]
}

// looseDir reads the loose object files of a repository's objects
// directory through an os.Root (go-billy's chroot resolves every path
// component itself, several lstat calls a file).
type looseDir struct {
	root *os.Root
}

// openLooseDir opens the objects directory of s when s is a repository on
// disk (go-git's filesystem storage; the common directory of a linked work
// tree), else returns nil. The caller closes it.
func openLooseDir(s storer.EncodedObjectStorer) *looseDir {
	type onDisk interface{ Filesystem() billy.Filesystem }
	d, ok := s.(onDisk)
	if !ok || d.Filesystem() == nil {
		return nil
	}
	objects, err := d.Filesystem().Chroot("objects")
	if err != nil || !filepath.IsAbs(objects.Root()) {
		return nil
	}
	root, err := os.OpenRoot(objects.Root())
	if err != nil {
		return nil
	}
	return &looseDir{root: root}
}

// Close closes the directory; a nil looseDir is fine.
func (l *looseDir) Close() {
	if l != nil {
		_ = l.root.Close()
	}
}

// readFiles reads, of hashes, the objects stored loose in l in files of at
// least minLooseFileBytes: each file's bytes as they are, with the type
// and size of its header (only the header is inflated), in the order of
// hashes. rest are the other hashes (packed, or in smaller files). More
// than limit such files (limit < 0: no limit) stop the reading: no file,
// and every hash in rest. Up to GOMAXPROCS goroutines read, each a share
// of hashes; they have ended when readFiles returns.
func (l *looseDir) readFiles(hashes []plumbing.Hash, limit int) (files []looseFile, rest []plumbing.Hash, err error) {
	got := make([]looseFile, len(hashes))
	errs := make([]error, len(hashes))
	var found atomic.Int64
	var wg sync.WaitGroup
	n := max(1, min(runtime.GOMAXPROCS(0), len(hashes)))
	for w := range n {
		wg.Go(func() {
			for i := w; i < len(hashes); i += n {
				if limit >= 0 && found.Load() > int64(limit) {
					return
				}
				if got[i], errs[i] = l.readFile(hashes[i]); got[i].data != nil {
					found.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if limit >= 0 && found.Load() > int64(limit) {
		return nil, hashes, nil
	}
	for i, f := range got {
		switch {
		case errs[i] != nil:
			return nil, nil, fmt.Errorf("object %s: %w", hashes[i], errs[i])
		case f.data == nil:
			rest = append(rest, hashes[i])
		default:
			files = append(files, f)
		}
	}
	return files, rest, nil
}

// readFile reads loose object h's file and its header; a zero looseFile
// and no error when h is not a loose object or its file is smaller than
// minLooseFileBytes.
func (l *looseDir) readFile(h plumbing.Hash) (looseFile, error) {
	f := looseFile{hash: h}
	fd, err := l.root.Open(f.name()[len("objects/"):])
	if errors.Is(err, fs.ErrNotExist) {
		return looseFile{}, nil
	}
	if err != nil {
		return looseFile{}, err
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil || st.Size() < minLooseFileBytes {
		return looseFile{}, err
	}
	// A loose object file never changes: exactly its size is read.
	data := make([]byte, st.Size())
	if _, err := io.ReadFull(fd, data); err != nil {
		return looseFile{}, err
	}
	// The header is the object's first bytes: inflating a prefix of the
	// file finds it (a decoder inflates up to its 32 KiB window at once),
	// the whole file only when the prefix is too short.
	for _, n := range []int{min(len(data), 512), len(data)} {
		if f.typ, f.size, err = peekHeader(data[:n]); err == nil || n == len(data) {
			break
		}
	}
	if err != nil {
		return looseFile{}, err
	}
	f.data = data
	return f, nil
}

// peekHeader returns the type and size of the loose object header at the
// start of the inflated zlib stream z (z may be cut short after it).
func peekHeader(z []byte) (plumbing.ObjectType, int64, error) {
	return peekHeaderFrom(bytes.NewReader(z))
}

// peekHeaderFrom is peekHeader of the zlib stream r: it reads no more of r
// than the header needs (and the decoder's buffer).
func peekHeaderFrom(r io.Reader) (plumbing.ObjectType, int64, error) {
	zr, err := openZlib(r)
	if err != nil {
		return 0, 0, fmt.Errorf("loose object: %w", err)
	}
	defer zlibReaders.Put(zr)
	// At most 6 + 1 + 19 + 1 bytes: "commit", a space, a size, a NUL.
	return looseHeader(bufio.NewReaderSize(io.LimitReader(zr, 32), 32))
}
