package workspace

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/klauspost/compress/zlib"
)

// idxMagic opens a pack index of version 2.
var idxMagic = []byte{0xff, 't', 'O', 'c', 0, 0, 0, 2}

// idxNames is where a pack index's table of names starts: after the
// magic and the fan-out table of 256 counts.
const idxNames = 8 + 256*4

// packIndex is a pack index (version 2) in a snapshot whose head was read:
// its fan-out table, and the count of objects it lists, its tables
// checked to fit in it (git's gitformat-pack(5), "Version 2 pack-*.idx").
type packIndex struct {
	r    io.ReaderAt
	span fileSpan
	head []byte
	n    int64
}

// errIndexTruncated is a pack index's error when a table it declares
// lies past its end.
var errIndexTruncated = errors.New("its index is truncated")

// openPackIndex reads the head of the pack index at span of r (its magic
// and fan-out table) and checks that the tables of its n objects fit in
// it.
func openPackIndex(r io.ReaderAt, span fileSpan) (*packIndex, error) {
	x := &packIndex{r: r, span: span, head: make([]byte, idxNames)}
	if err := x.read(0, x.head); err != nil {
		return nil, err
	}
	if !bytes.Equal(x.head[:8], idxMagic) {
		return nil, errors.New("its index is not of version 2")
	}
	x.n = x.fanout(255)
	if idxNames+28*x.n+40 > span.size {
		return nil, errIndexTruncated
	}
	return x, nil
}

// read fills b from offset at of the index.
func (x *packIndex) read(at int64, b []byte) error {
	if at < 0 || at+int64(len(b)) > x.span.size {
		return errIndexTruncated
	}
	_, err := x.r.ReadAt(b, x.span.off+at)
	return err
}

// fanout returns the i-th count of the fan-out table: how many names of
// the index start with a byte of at most i.
func (x *packIndex) fanout(i int) int64 {
	return int64(binary.BigEndian.Uint32(x.head[8+4*i:]))
}

// offset returns the pack offset an entry of the index's table of 4-byte
// offsets gives: the entry itself, or, with its top bit set, the entry of
// the table of 8-byte offsets it points to.
func (x *packIndex) offset(entry uint32) (int64, error) {
	if entry&0x80000000 == 0 {
		return int64(entry), nil
	}
	var b [8]byte
	if err := x.read(idxNames+28*x.n+8*int64(entry&0x7fffffff), b[:]); err != nil {
		return 0, err
	}
	return int64(binary.BigEndian.Uint64(b[:]) & (1<<63 - 1)), nil
}

// packOffset looks h up in the pack index (version 2) at idx of r and
// returns its offset in the pack.
func packOffset(r io.ReaderAt, idx fileSpan, h plumbing.Hash) (int64, bool, error) {
	x, err := openPackIndex(r, idx)
	if err != nil {
		return 0, false, err
	}
	return x.find(h)
}

// find looks h up and returns its offset in the pack. It reads the names
// a binary search visits, nothing else of the index.
func (x *packIndex) find(h plumbing.Hash) (int64, bool, error) {
	lo, hi := int64(0), x.fanout(int(h[0]))
	if h[0] > 0 {
		lo = x.fanout(int(h[0]) - 1)
	}
	if lo > hi || hi > x.n {
		return 0, false, errors.New("its fan-out table is not sorted")
	}
	var name [20]byte
	for lo < hi {
		mid := lo + (hi-lo)/2
		if err := x.read(idxNames+20*mid, name[:]); err != nil {
			return 0, false, err
		}
		switch c := bytes.Compare(name[:], h[:]); {
		case c == 0:
			var b [4]byte
			if err := x.read(idxNames+24*x.n+4*mid, b[:]); err != nil {
				return 0, false, err
			}
			off, err := x.offset(binary.BigEndian.Uint32(b[:]))
			return off, err == nil, err
		case c < 0:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return 0, false, nil
}

// packSection returns the part of pack from offset off to its end, where
// an entry starts; an offset inside the pack's header or past its end is
// an error.
func packSection(r io.ReaderAt, pack fileSpan, off int64) (*io.SectionReader, error) {
	if off < 12 || off >= pack.size {
		return nil, fmt.Errorf("offset %d is outside the pack", off)
	}
	return io.NewSectionReader(r, pack.off+off, pack.size-off), nil
}

// readPackObject reads the whole object at off of a pack: a commit, tree,
// blob or tag stored whole (a snapshot's pack holds no deltas), at most
// maxVerifyObject bytes once inflated.
func readPackObject(r io.ReaderAt, pack fileSpan, off int64) (plumbing.ObjectType, []byte, error) {
	sr, err := packSection(r, pack, off)
	if err != nil {
		return 0, nil, err
	}
	br := bufio.NewReader(sr)
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
	x, err := openPackIndex(r, idx)
	if err != nil {
		return err
	}
	nr := bufio.NewReader(io.NewSectionReader(r, idx.off+idxNames, 20*x.n))
	or := bufio.NewReader(io.NewSectionReader(r, idx.off+idxNames+24*x.n, 4*x.n))
	var name plumbing.Hash
	var b [4]byte
	for range x.n {
		if _, err := io.ReadFull(nr, name[:]); err != nil {
			return err
		}
		if _, err := io.ReadFull(or, b[:]); err != nil {
			return err
		}
		off, err := x.offset(binary.BigEndian.Uint32(b[:]))
		if err != nil {
			return err
		}
		got, err := o.hashPacked(r, pack, off, max)
		if err != nil {
			return fmt.Errorf("object %s: %w", name, err)
		}
		if got != name {
			return fmt.Errorf("the object stored as %s hashes to %s", name, got)
		}
	}
	return nil
}

// hashPacked returns the name the object at off of pack hashes to,
// inflated as a stream into the hash, at most max bytes (0: no bound).
func (o *objectReader) hashPacked(r io.ReaderAt, pack fileSpan, off, max int64) (plumbing.Hash, error) {
	sr, err := packSection(r, pack, off)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if o.br == nil {
		o.br = bufio.NewReader(sr)
	} else {
		o.br.Reset(sr)
	}
	typ, size, err := packEntryHeader(o.br)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	z, err := o.inflater(o.br)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	return hashStream(z, typ, size, max)
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
