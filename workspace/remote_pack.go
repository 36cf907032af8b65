package workspace

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
)

// Bounds of a fetched pack (Remote.Snapshot).
const (
	// packObjectCost is what each object of a fetched pack counts against
	// RemoteOptions.MaxBytes beside its inflated size, in bytes: go-git
	// keeps about that much bookkeeping per object while it indexes a
	// pack, so a pack of millions of empty objects, a few bytes each on
	// the wire, is bounded too.
	packObjectCost = 256
	// largeObjectBytes is the size, in bytes, above which an object of a
	// fetched pack is streamed from the pack's file whenever it is read,
	// never held in memory whole (go-git's LargeObjectThreshold).
	largeObjectBytes = 1 << 20
	// fetchCacheBytes bounds go-git's cache of decoded objects while a
	// fetched commit is snapshotted, in bytes.
	fetchCacheBytes = 16 * cache.MiByte
)

// indexPack checks the pack f (checkPack, max bytes) and writes its index
// into dir as pack-<checksum>.idx, and returns the pack's checksum. go-git
// reads each object to hash it, one at a time; checkPack has bounded them
// all first.
func indexPack(f *os.File, dir string, max int64) (plumbing.Hash, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return plumbing.ZeroHash, err
	}
	if err := checkPack(f, max); err != nil {
		return plumbing.ZeroHash, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return plumbing.ZeroHash, err
	}
	iw := new(idxfile.Writer)
	p, err := packfile.NewParser(packfile.NewScanner(f), iw)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	sum, err := p.Parse()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	idx, err := iw.Index()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	out, err := os.OpenFile(filepath.Join(dir, "pack-"+sum.String()+".idx"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	_, err = idxfile.NewEncoder(out).Encode(idx)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return sum, err
}

// checkPack reads the pack r from its start and sums, for each object,
// the size its header declares inflated (for a delta: the delta's own,
// and the size of the object it makes, read from the delta's first bytes)
// and packObjectCost, checking the sum against max bytes (0: no bound)
// before the object is inflated: past it the error wraps ErrTooLarge.
// Each object is then inflated into nothing, at most its declared size
// (go-git's scanner stops an object that inflates further), to reach the
// next header. A malformed pack is an error too.
func checkPack(r io.ReadSeeker, max int64) error {
	if max <= 0 {
		return nil
	}
	sc := packfile.NewScanner(r)
	_, count, err := sc.Header()
	if err != nil {
		return err
	}
	var total int64
	add := func(n int64, what string) error {
		if n < 0 || n > max || total+n > max {
			return fmt.Errorf("%w: the fetched objects exceed %d bytes inflated (%s, declared before inflating)", ErrTooLarge, max, what)
		}
		total += n
		return nil
	}
	for i := range count {
		oh, err := sc.NextObjectHeader()
		if err != nil {
			return err
		}
		if err := add(oh.Length+packObjectCost, fmt.Sprintf("object %d of %d: %s of %d bytes", i+1, count, oh.Type, oh.Length)); err != nil {
			return err
		}
		if !oh.Type.IsDelta() {
			continue // inflated into nothing by the next NextObjectHeader
		}
		rc, err := sc.ReadObject()
		if err != nil {
			return err
		}
		target, err := deltaTargetSize(rc)
		if err == nil {
			err = add(target, fmt.Sprintf("object %d of %d: a delta making %d bytes", i+1, count, target))
		}
		if err == nil {
			_, err = io.Copy(io.Discard, rc)
		}
		if cerr := rc.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// errBadDelta is a delta whose header cannot be read.
var errBadDelta = errors.New("malformed delta header")

// deltaTargetSize reads a delta's header from r (two sizes, each a
// little-endian base-128 number: the source's, then the target's) and
// returns the target's size in bytes.
func deltaTargetSize(r io.Reader) (int64, error) {
	var size int64
	for range 2 {
		size = 0
		var b [1]byte
		for shift := uint(0); ; shift += 7 {
			if shift > 56 {
				return 0, errBadDelta
			}
			if _, err := io.ReadFull(r, b[:]); err != nil {
				return 0, fmt.Errorf("%w: %w", errBadDelta, err)
			}
			size |= int64(b[0]&0x7f) << shift
			if b[0]&0x80 == 0 {
				break
			}
		}
	}
	return size, nil
}
