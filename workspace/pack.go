package workspace

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"slices"

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
// also counts the commits.
func encodePack(s storer.EncodedObjectStorer, hashes []plumbing.Hash) (packed, error) {
	hashes = slices.Clone(hashes)
	slices.SortFunc(hashes, func(a, b plumbing.Hash) int { return bytes.Compare(a[:], b[:]) })
	var pb bytes.Buffer
	pb.WriteString("PACK")
	_ = binary.Write(&pb, binary.BigEndian, uint32(2))
	_ = binary.Write(&pb, binary.BigEndian, uint32(len(hashes)))
	iw := new(idxfile.Writer)
	if err := iw.OnHeader(uint32(len(hashes))); err != nil {
		return packed{}, err
	}
	zw, _ := zlib.NewWriterLevel(nil, zlib.BestSpeed)
	commits := 0
	for _, h := range hashes {
		o, err := s.EncodedObject(plumbing.AnyObject, h)
		if err != nil {
			return packed{}, fmt.Errorf("object %s: %w", h, err)
		}
		if o.Type() == plumbing.CommitObject {
			commits++
		}
		start := pb.Len()
		writeEntryHeader(&pb, o.Type(), o.Size())
		r, err := o.Reader()
		if err != nil {
			return packed{}, err
		}
		zw.Reset(&pb)
		_, err = io.Copy(zw, r)
		r.Close()
		if cerr := zw.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return packed{}, fmt.Errorf("object %s: %w", h, err)
		}
		iw.Add(h, uint64(start), crc32.ChecksumIEEE(pb.Bytes()[start:]))
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
	return packed{pack: pb.Bytes(), idx: ib.Bytes(), sum: ph.String(), commits: commits}, nil
}

// packed is a pack made by encodePack: its bytes, its index, its checksum
// in hex and how many commits it holds.
type packed struct {
	pack, idx []byte
	sum       string
	commits   int
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
