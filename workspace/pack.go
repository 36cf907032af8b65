package workspace

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"runtime"
	"slices"
	"sync/atomic"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
	"github.com/go-git/go-git/v5/plumbing/storer"
)

// encodePack writes the objects hashes of s as one git pack (version 2,
// no deltas, each object zlib-compressed at BestSpeed) and its index
// (version 2), and returns them with the pack's checksum in hex. Its bytes
// depend only on the set of objects. go-git's own encoder compresses at the
// default level and parses the pack again for the index; this one is
// several times faster on large histories, which every snapshot pays. It
// also counts the commits and records each object's size.
//
// The objects are compressed by up to GOMAXPROCS goroutines, a run of
// objects each, and joined in hash order. Loose objects of a repository on
// disk (s has a Filesystem, as go-git's filesystem storage does) are read
// straight from their files (see looseObjects), the rest through s.
func encodePack(s storer.EncodedObjectStorer, hashes []plumbing.Hash) (packed, error) {
	hashes = slices.Clone(hashes)
	slices.SortFunc(hashes, func(a, b plumbing.Hash) int { return bytes.Compare(a[:], b[:]) })
	src := objectSource{s: s, loose: newLooseObjects(s)}
	chunks := packChunks(src, hashes)
	total := 12 + sha1.Size
	for _, c := range chunks {
		<-c.done
		if c.err != nil {
			return packed{}, c.err
		}
		total += c.buf.Len()
	}
	var pb bytes.Buffer
	pb.Grow(total) // one allocation for the whole pack
	pb.WriteString("PACK")
	_ = binary.Write(&pb, binary.BigEndian, uint32(2))
	_ = binary.Write(&pb, binary.BigEndian, uint32(len(hashes)))
	iw := new(idxfile.Writer)
	if err := iw.OnHeader(uint32(len(hashes))); err != nil {
		return packed{}, err
	}
	commits := 0
	sizes := make(map[plumbing.Hash]int64, len(hashes))
	for _, c := range chunks {
		for i, h := range c.hashes {
			start := uint64(pb.Len())
			e := c.buf.Bytes()[c.ends[i]-c.lens[i] : c.ends[i]]
			pb.Write(e)
			iw.Add(h, start, crc32.ChecksumIEEE(e))
			sizes[h] = c.sizes[i]
		}
		commits += c.commits
		c.buf = nil
	}
	trailer := sha1.Sum(pb.Bytes())
	pb.Write(trailer[:])
	var ph plumbing.Hash
	copy(ph[:], trailer[:])
	if err := iw.OnFooter(ph); err != nil {
		return packed{}, err
	}
	mi, err := iw.Index()
	if err != nil {
		return packed{}, err
	}
	var ib bytes.Buffer
	if _, err := idxfile.NewEncoder(&ib).Encode(mi); err != nil {
		return packed{}, err
	}
	return packed{pack: pb.Bytes(), idx: ib.Bytes(), sum: ph.String(), commits: commits, sizes: sizes}, nil
}

// packChunk is a run of consecutive objects of a pack, encoded by one
// goroutine: their entries back to back in buf (entry i ends at ends[i]
// and is lens[i] bytes long; the object is sizes[i] bytes). done is closed
// when buf, or err, is set.
type packChunk struct {
	hashes     []plumbing.Hash
	buf        *bytes.Buffer
	ends, lens []int
	sizes      []int64
	commits    int
	err        error
	done       chan struct{}
}

// packChunkObjects is how many objects one packChunk holds.
const packChunkObjects = 32

// packChunks splits hashes into chunks and encodes them with up to
// GOMAXPROCS goroutines, which end when every chunk is done (the caller
// waits on each chunk's done; after a failure the rest end at once).
func packChunks(src objectSource, hashes []plumbing.Hash) []*packChunk {
	var chunks []*packChunk
	for c := range slices.Chunk(hashes, packChunkObjects) {
		chunks = append(chunks, &packChunk{hashes: c, done: make(chan struct{})})
	}
	next := make(chan *packChunk, len(chunks))
	for _, c := range chunks {
		next <- c
	}
	close(next)
	var failed atomic.Bool
	for range min(runtime.GOMAXPROCS(0), len(chunks)) {
		go func() {
			enc := &entryEncoder{copyBuf: make([]byte, 32<<10)}
			for c := range next {
				if failed.Load() {
					c.err = errors.New("an earlier object failed")
				} else if c.err = c.encode(src, enc); c.err != nil {
					failed.Store(true)
				}
				close(c.done)
			}
		}()
	}
	return chunks
}

// encode writes c's entries into c.buf with enc.
func (c *packChunk) encode(src objectSource, enc *entryEncoder) error {
	c.buf = new(bytes.Buffer)
	for _, h := range c.hashes {
		start := c.buf.Len()
		t, size, err := src.copyObject(h, c.buf, enc)
		if err != nil {
			return fmt.Errorf("object %s: %w", h, err)
		}
		if t == plumbing.CommitObject {
			c.commits++
		}
		c.ends = append(c.ends, c.buf.Len())
		c.lens = append(c.lens, c.buf.Len()-start)
		c.sizes = append(c.sizes, size)
	}
	return nil
}

// objectSource reads the objects of a pack: loose ones from their files
// when loose is set, the others from s.
type objectSource struct {
	s     storer.EncodedObjectStorer
	loose *looseObjects
}

// copyObject writes object h's pack entry (type and size header, then its
// content compressed by enc) to w and returns its type and size.
func (src objectSource) copyObject(h plumbing.Hash, w *bytes.Buffer, enc *entryEncoder) (plumbing.ObjectType, int64, error) {
	if m, ok := src.s.(heldObjects); ok {
		if o, ok := m.heldObject(h); ok {
			r, err := o.Reader()
			if err != nil {
				return 0, 0, err
			}
			writeEntryHeader(w, o.Type(), o.Size())
			return o.Type(), o.Size(), enc.compress(w, r, o.Size())
		}
	}
	if src.loose != nil {
		t, size, ok, err := src.loose.copyObject(h, w, enc)
		if ok || err != nil {
			return t, size, err
		}
	}
	o, err := src.s.EncodedObject(plumbing.AnyObject, h)
	if err != nil {
		return 0, 0, err
	}
	writeEntryHeader(w, o.Type(), o.Size())
	r, err := o.Reader()
	if err != nil {
		return 0, 0, err
	}
	defer r.Close()
	return o.Type(), o.Size(), enc.compress(w, r, o.Size())
}

// heldObjects is a store holding some objects in memory (captureStore):
// encodePack takes those from it before it looks for a loose file.
type heldObjects interface {
	heldObject(h plumbing.Hash) (*plumbing.MemoryObject, bool)
}

// entryEncoder compresses pack entries; one goroutine uses one, so its
// zlib writer and buffers are reused from object to object.
type entryEncoder struct {
	zw      *zlib.Writer
	copyBuf []byte
	br      *bufio.Reader
}

// compress writes exactly size bytes of r to w as one zlib stream
// (BestSpeed).
func (e *entryEncoder) compress(w *bytes.Buffer, r io.Reader, size int64) error {
	if e.zw == nil {
		e.zw, _ = zlib.NewWriterLevel(w, zlib.BestSpeed)
	} else {
		e.zw.Reset(w)
	}
	n, err := io.CopyBuffer(e.zw, io.LimitReader(r, size), e.copyBuf)
	if cerr := e.zw.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != size {
		err = fmt.Errorf("object is %d bytes, its header says %d", n, size)
	}
	return err
}

// packed is a pack made by encodePack: its bytes, its index, its checksum
// in hex, how many commits it holds and each object's size in bytes.
type packed struct {
	pack, idx []byte
	sum       string
	commits   int
	sizes     map[plumbing.Hash]int64
}

// writeEntryHeader writes a pack entry's type and size header: the type in
// bits 4-6 of the first byte, the size in its low 4 bits and then 7 bits a
// byte, each byte but the last with its high bit set.
func writeEntryHeader(w *bytes.Buffer, t plumbing.ObjectType, size int64) {
	b := byte(t)<<4 | byte(size&0x0f)
	size >>= 4
	for size > 0 {
		w.WriteByte(b | 0x80)
		b = byte(size & 0x7f)
		size >>= 7
	}
	w.WriteByte(b)
}
