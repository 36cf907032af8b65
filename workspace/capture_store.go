package workspace

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/go-git/go-billy/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/storage/filesystem"
)

// captureMemBytes bounds the content of the objects a capture's
// captureStore holds in memory: 32 MiB, about the new content of a large
// change of source files. The objects beyond it go to the scratch
// directory as loose files. go-git's object cache, which kept every object
// a capture read back (96 MiB at most), no longer holds these, so a
// capture's memory grows by less than this bound. A variable for tests.
var captureMemBytes int64 = 32 << 20

// captureStore is a capture's object store: the objects the capture makes
// or copies (blobs of the work tree, trees, commits, the run's objects) in
// memory up to max bytes of content in all, the rest in fs, go-git's
// filesystem storage in the scratch directory, which also holds the
// snapshot's object files (copied as they are). A loose object file costs
// a temporary file, a rename, zlib both ways and a bound path resolution
// (an lstat a path component) each time it is written, looked for or read:
// for the small objects of a typical change, most of a capture's time.
//
// An object is held when it is a *plumbing.MemoryObject (go-git's
// NewEncodedObject gives one) and fits; held objects are never changed
// after SetEncodedObject. Not safe for concurrent writes; readers may run
// concurrently once writing is done (encodePack's goroutines do).
//
// Nothing but the store writes fs's objects directory, so the store knows
// what fs holds without asking it: the loose files it wrote or was told of
// (addObjectFile) and the names of the packs' indexes. HasEncodedObject,
// asked for every file of the snapshot and of the work tree, so answers
// with no system call; fs looked for a loose file first, resolving its
// path component by component, whatever the answer.
type captureStore struct {
	fs        *filesystem.Storage
	mem       map[plumbing.Hash]*plumbing.MemoryObject
	held, max int64
	// loose holds the objects fs has as loose files, packs the indexes
	// of its packs (object names and offsets only), packFiles which of a
	// pack's two files (1: .pack, 2: .idx) were added, by pack name.
	loose     map[plumbing.Hash]struct{}
	packs     []*idxfile.MemoryIndex
	packFiles map[string]int
}

var _ storer.EncodedObjectStorer = (*captureStore)(nil)

// newCaptureStore returns a store over fs holding up to max bytes of
// object content in memory.
func newCaptureStore(fs *filesystem.Storage, max int64) *captureStore {
	return &captureStore{fs: fs, mem: map[plumbing.Hash]*plumbing.MemoryObject{}, max: max,
		loose: map[plumbing.Hash]struct{}{}, packFiles: map[string]int{}}
}

// addObjectFile tells s of an object file written into fs's objects
// directory at path, rel its name there (objectFileRE): a loose object,
// or a pack or its index. Once both files of a pack are there, its index
// is read (the pack checksum it names must be the pack's name, as go-git
// requires) and fs reads its pack list again.
func (s *captureStore) addObjectFile(rel, path string) error {
	name, ok := strings.CutPrefix(rel, "pack/")
	if !ok {
		s.loose[plumbing.NewHash(strings.Replace(rel, "/", "", 1))] = struct{}{}
		return nil
	}
	pack, ext, _ := strings.Cut(name, ".")
	if ext == "pack" {
		s.packFiles[pack] |= 1
	} else {
		s.packFiles[pack] |= 2
	}
	if s.packFiles[pack] != 3 {
		return nil
	}
	idxPath := path
	if ext == "pack" {
		idxPath = strings.TrimSuffix(path, ".pack") + ".idx"
	}
	f, err := os.Open(idxPath)
	if err != nil {
		return err
	}
	defer f.Close()
	idx := idxfile.NewMemoryIndex()
	if err := idxfile.NewDecoder(f).Decode(idx); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if want := plumbing.NewHash(strings.TrimPrefix(pack, "pack-")); !bytes.Equal(idx.PackfileChecksum[:], want[:]) {
		return fmt.Errorf("%s: %w: its index is of pack %s", name, idxfile.ErrMalformedIdxFile, plumbing.Hash(idx.PackfileChecksum))
	}
	idx.CRC32 = nil // not needed to find a name
	s.packs = append(s.packs, idx)
	s.fs.Reindex()
	return nil
}

// NewEncodedObject returns an empty in-memory object.
func (s *captureStore) NewEncodedObject() plumbing.EncodedObject { return &plumbing.MemoryObject{} }

// SetEncodedObject stores o: in memory when it is an in-memory object that
// fits in what is left of the bound, else in fs.
func (s *captureStore) SetEncodedObject(o plumbing.EncodedObject) (plumbing.Hash, error) {
	mo, ok := o.(*plumbing.MemoryObject)
	if !ok || s.held+o.Size() > s.max || o.Type() == plumbing.OFSDeltaObject || o.Type() == plumbing.REFDeltaObject {
		h, err := s.fs.SetEncodedObject(o)
		if err == nil {
			s.loose[h] = struct{}{}
		}
		return h, err
	}
	h := mo.Hash()
	if _, ok := s.mem[h]; !ok {
		s.mem[h] = mo
		s.held += mo.Size()
	}
	return h, nil
}

// heldObject returns object h when it is held in memory.
func (s *captureStore) heldObject(h plumbing.Hash) (*plumbing.MemoryObject, bool) {
	o, ok := s.mem[h]
	return o, ok
}

// EncodedObject returns object h of type t (or any type: plumbing.AnyObject).
func (s *captureStore) EncodedObject(t plumbing.ObjectType, h plumbing.Hash) (plumbing.EncodedObject, error) {
	if o, ok := s.mem[h]; ok {
		if t != plumbing.AnyObject && o.Type() != t {
			return nil, plumbing.ErrObjectNotFound
		}
		return o, nil
	}
	return s.fs.EncodedObject(t, h)
}

// IterEncodedObjects iterates the objects of type t, those in memory first.
func (s *captureStore) IterEncodedObjects(t plumbing.ObjectType) (storer.EncodedObjectIter, error) {
	var held []plumbing.EncodedObject
	for _, o := range s.mem {
		if t == plumbing.AnyObject || o.Type() == t {
			held = append(held, o)
		}
	}
	rest, err := s.fs.IterEncodedObjects(t)
	if err != nil {
		return nil, err
	}
	return storer.NewMultiEncodedObjectIter([]storer.EncodedObjectIter{storer.NewEncodedObjectSliceIter(held), rest}), nil
}

// HasEncodedObject returns nil when s holds object h, else
// plumbing.ErrObjectNotFound.
func (s *captureStore) HasEncodedObject(h plumbing.Hash) error {
	if _, ok := s.mem[h]; ok {
		return nil
	}
	if _, ok := s.loose[h]; ok {
		return nil
	}
	for _, idx := range s.packs {
		if ok, _ := idx.Contains(h); ok {
			return nil
		}
	}
	return plumbing.ErrObjectNotFound
}

// EncodedObjectSize returns the size of object h's content.
func (s *captureStore) EncodedObjectSize(h plumbing.Hash) (int64, error) {
	if o, ok := s.mem[h]; ok {
		return o.Size(), nil
	}
	return s.fs.EncodedObjectSize(h)
}

// AddAlternate adds an alternate object directory to fs.
func (s *captureStore) AddAlternate(remote string) error { return s.fs.AddAlternate(remote) }

// Filesystem returns fs's directory: encodePack reads the loose object
// files there directly.
func (s *captureStore) Filesystem() billy.Filesystem { return s.fs.Filesystem() }
