package workspace

import (
	"cmp"
	"errors"
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
	h, data, err := hashBlob(size, open)
	if err != nil {
		return plumbing.ZeroHash, err
	}
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
	if err := writeBlob(o, size, data, open); err != nil {
		return plumbing.ZeroHash, err
	}
	got, err := s.SetEncodedObject(o)
	if err == nil && got != h {
		err = errFileChanged
	}
	return got, err
}

// errFileChanged is storeBlob's error for a file whose bytes are not the
// size it was given, or differ between its two reads.
var errFileChanged = errors.New("file changed while it was read")

// smallBlobBytes is the largest blob storeBlob reads once, into memory,
// to hash it and to store it: a smaller file is read (opened) once, not
// twice.
const smallBlobBytes = 64 << 10

// hashBlob reads the size bytes open gives and returns their blob hash
// and, for a blob of at most smallBlobBytes, the bytes themselves (read
// into memory; nil for a larger one, hashed as a stream).
func hashBlob(size int64, open func() (io.ReadCloser, error)) (plumbing.Hash, []byte, error) {
	r, err := open()
	if err != nil {
		return plumbing.ZeroHash, nil, err
	}
	defer r.Close()
	if size > smallBlobBytes {
		hasher := plumbing.NewHasher(plumbing.BlobObject, size)
		if n, err := io.Copy(hasher, io.LimitReader(r, size)); err != nil || n != size {
			return plumbing.ZeroHash, nil, cmp.Or(err, errFileChanged)
		}
		return hasher.Sum(), nil, nil
	}
	data := make([]byte, size)
	_, err = io.ReadFull(r, data)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) && size > 0 {
		return plumbing.ZeroHash, nil, errFileChanged
	}
	if err != nil {
		return plumbing.ZeroHash, nil, err
	}
	return plumbing.ComputeHash(plumbing.BlobObject, data), data, nil
}

// writeBlob writes a blob's content into o: data when hashBlob held it,
// else the size bytes open gives once more.
func writeBlob(o plumbing.EncodedObject, size int64, data []byte, open func() (io.ReadCloser, error)) error {
	w, err := o.Writer()
	if err != nil {
		return err
	}
	if data != nil {
		_, err = w.Write(data)
	} else {
		var r io.ReadCloser
		if r, err = open(); err == nil {
			_, err = io.Copy(w, io.LimitReader(r, size))
			r.Close()
		}
	}
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return err
}
