package workspace

import (
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
)

// treeBuilder collects files by path and writes them as git trees.
type treeBuilder struct {
	// dirs maps a directory ("" for the top) to its entries.
	dirs map[string][]object.TreeEntry
	// linked holds the directories already entered in their parent.
	linked map[string]bool
	// fixed holds the directories added whole (addTree), written as
	// they are.
	fixed map[string]bool
}

func newTreeBuilder() *treeBuilder {
	return &treeBuilder{dirs: map[string][]object.TreeEntry{"": nil}, linked: map[string]bool{}, fixed: map[string]bool{}}
}

// addTree records an existing tree (hash h) as the directory at slash
// path p, nothing to be added under it.
func (b *treeBuilder) addTree(p string, h plumbing.Hash) {
	b.fixed[p] = true
	b.add(p, filemode.Dir, h)
}

// add records a file (blob hash h, mode m) at slash path p.
func (b *treeBuilder) add(p string, m filemode.FileMode, h plumbing.Hash) {
	dir, name := splitPath(p)
	b.dirs[dir] = append(b.dirs[dir], object.TreeEntry{Name: name, Mode: m, Hash: h})
	for d := dir; d != ""; {
		if _, ok := b.dirs[d]; ok && b.linked[d] {
			break
		}
		b.linked[d] = true
		if _, ok := b.dirs[d]; !ok {
			b.dirs[d] = nil
		}
		parent, base := splitPath(d)
		b.dirs[parent] = append(b.dirs[parent], object.TreeEntry{Name: base, Mode: filemode.Dir})
		d = parent
	}
}

// splitPath returns p's directory ("" at the top) and base name.
func splitPath(p string) (string, string) {
	dir, name := path.Split(p)
	return strings.TrimSuffix(dir, "/"), name
}

// write stores every tree in s and returns the root tree's hash.
func (b *treeBuilder) write(s storer.EncodedObjectStorer) (plumbing.Hash, error) {
	return b.writeDir(s, "")
}

func (b *treeBuilder) writeDir(s storer.EncodedObjectStorer, dir string) (plumbing.Hash, error) {
	entries := b.dirs[dir]
	for i := range entries {
		if sub := joinPath(dir, entries[i].Name); entries[i].Mode == filemode.Dir && !b.fixed[sub] {
			h, err := b.writeDir(s, sub)
			if err != nil {
				return plumbing.ZeroHash, err
			}
			entries[i].Hash = h
		}
	}
	return storeTree(s, entries)
}

// storeBlob stores the size bytes read from r as a blob in s, unless s
// already holds it, and returns its hash. open is called once more to store
// a blob s lacks, so unchanged files cost one read and no memory.
//
// When s lacks the blob, admit (unless nil) is called before it is stored,
// and its error is returned instead: a caller's budget is checked before
// the blob is held in memory.
func storeBlob(s storer.EncodedObjectStorer, size int64, open func() (io.ReadCloser, error), admit func() error) (plumbing.Hash, error) {
	if size <= smallBlobBytes {
		return storeSmallBlob(s, size, open, admit)
	}
	hasher := plumbing.NewHasher(plumbing.BlobObject, size)
	r, err := open()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	n, err := io.Copy(hasher, io.LimitReader(r, size))
	r.Close()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if n != size {
		return plumbing.ZeroHash, fmt.Errorf("file changed while it was read")
	}
	h := hasher.Sum()
	if s.HasEncodedObject(h) == nil {
		return h, nil
	}
	if admit != nil {
		if err := admit(); err != nil {
			return plumbing.ZeroHash, err
		}
	}
	o := s.NewEncodedObject()
	o.SetType(plumbing.BlobObject)
	o.SetSize(size)
	w, err := o.Writer()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if r, err = open(); err != nil {
		return plumbing.ZeroHash, err
	}
	_, err = io.Copy(w, io.LimitReader(r, size))
	r.Close()
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return plumbing.ZeroHash, err
	}
	got, err := s.SetEncodedObject(o)
	if err == nil && got != h {
		err = fmt.Errorf("file changed while it was read")
	}
	return got, err
}

// smallBlobBytes is the largest blob storeBlob reads once, into memory,
// to hash it and to store it: a smaller file is read (opened) once, not
// twice.
const smallBlobBytes = 64 << 10

// storeSmallBlob is storeBlob for a blob of at most smallBlobBytes: its
// size bytes are read once into memory, hashed, and stored from there
// when s lacks them (admit first, as storeBlob does).
func storeSmallBlob(s storer.EncodedObjectStorer, size int64, open func() (io.ReadCloser, error), admit func() error) (plumbing.Hash, error) {
	r, err := open()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	data := make([]byte, size)
	n, err := io.ReadFull(r, data)
	r.Close()
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) && size > 0 {
		return plumbing.ZeroHash, fmt.Errorf("file changed while it was read")
	}
	if err != nil {
		return plumbing.ZeroHash, err
	}
	h := plumbing.ComputeHash(plumbing.BlobObject, data[:n])
	if s.HasEncodedObject(h) == nil {
		return h, nil
	}
	if admit != nil {
		if err := admit(); err != nil {
			return plumbing.ZeroHash, err
		}
	}
	o := s.NewEncodedObject()
	o.SetType(plumbing.BlobObject)
	o.SetSize(size)
	w, err := o.Writer()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	_, err = w.Write(data)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return plumbing.ZeroHash, err
	}
	got, err := s.SetEncodedObject(o)
	if err == nil && got != h {
		err = fmt.Errorf("file changed while it was read")
	}
	return got, err
}
