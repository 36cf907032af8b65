package workspace

import (
	"crypto/sha1"
	"errors"
	"fmt"
	"io"
	"os"

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

// indexPack checks the pack f (rules.check) and writes its index into dir
// as pack-<checksum>.idx, and returns the pack's checksum. go-git's parser
// reads each object whole into memory to hash it, one at a time (deltas
// resolved against their base); the check has bounded them all first. A
// pack without deltas is indexed streamed by indexPlainPack.
func indexPack(f *os.File, dir string, rules packRules) (plumbing.Hash, error) {
	if err := rules.check(f); err != nil {
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
	return sum, writePackIndex(iw, dir, sum)
}

// packRules bound a pack read from an untrusted source (packRules.check).
type packRules struct {
	// max bounds the sizes the objects declare, summed with packObjectCost
	// each, in bytes; 0 means no bound.
	max int64
	// ratio, when positive, bounds each object declaring more than
	// ratioFloor bytes to ratio times its bytes in the pack (MaxInflateRatio).
	ratio, ratioFloor int64
	// noDeltas refuses delta objects (a pack jetcrew wrote holds none).
	noDeltas bool
}

// checkPack is packRules{max: max}.check(r).
func checkPack(r io.ReadSeeker, max int64) error { return packRules{max: max}.check(r) }

// check reads the pack r from its start and sums, for each object, the
// size its header declares inflated (for a delta: the delta's own, and the
// size of the object it makes, read from the delta's first bytes) and
// packObjectCost, checking the sum against max bytes before the object is
// inflated: past it the error wraps ErrTooLarge. Each object is then
// inflated into nothing, at most its declared size (go-git's scanner stops
// an object that inflates further), to reach the next header; its bytes
// in the pack (up to that header, or to the pack's trailer for the last)
// are then held against ratio: past it the error wraps
// ErrOutOfProportion. A delta, when noDeltas, wraps ErrBadArchive. A
// malformed pack is an error too.
func (rules packRules) check(r io.ReadSeeker) error {
	if rules.max <= 0 && rules.ratio <= 0 && !rules.noDeltas {
		return nil
	}
	end, err := r.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		return err
	}
	sc := packfile.NewScanner(r)
	_, count, err := sc.Header()
	if err != nil {
		return err
	}
	pc := &packCheck{rules: rules, count: count}
	for i := range count {
		oh, err := sc.NextObjectHeader()
		if err != nil {
			return err
		}
		if err := pc.object(i, oh); err != nil {
			return err
		}
		if !oh.Type.IsDelta() {
			continue // inflated into nothing by the next NextObjectHeader
		}
		if err := pc.delta(i, sc); err != nil {
			return err
		}
	}
	return pc.proportion(end - sha1.Size)
}

// packCheck is one packRules.check in progress: the declared bytes summed
// so far and the last object read, whose bytes in the pack are known once
// the next one's offset is.
type packCheck struct {
	rules packRules
	count uint32
	total int64
	last  *packfile.ObjectHeader
	lastI uint32
}

// add counts n more declared bytes against max.
func (pc *packCheck) add(n int64, what string) error {
	max := pc.rules.max
	if max > 0 && (n < 0 || n > max || pc.total+n > max) {
		return fmt.Errorf("%w: the objects exceed %d bytes inflated (%s, declared before inflating)", ErrTooLarge, max, what)
	}
	pc.total += n
	return nil
}

// object checks object i's header: the earlier object's proportion, then
// its own declared size.
func (pc *packCheck) object(i uint32, oh *packfile.ObjectHeader) error {
	if err := pc.proportion(oh.Offset); err != nil {
		return err
	}
	if pc.rules.noDeltas && oh.Type.IsDelta() {
		return fmt.Errorf("%w: object %d of %d is a delta (%s), which jetcrew never writes", ErrBadArchive, i+1, pc.count, oh.Type)
	}
	pc.last, pc.lastI = oh, i
	return pc.add(oh.Length+packObjectCost, fmt.Sprintf("object %d of %d: %s of %d bytes", i+1, pc.count, oh.Type, oh.Length))
}

// proportion checks the last object read, whose bytes in the pack end at
// offset end, against ratio. A delta is not held to it (its copies make
// bytes of another object).
func (pc *packCheck) proportion(end int64) error {
	oh, r := pc.last, pc.rules
	if oh == nil || r.ratio <= 0 || oh.Type.IsDelta() || oh.Length <= r.ratioFloor {
		return nil
	}
	if packed := end - oh.Offset; packed <= 0 || oh.Length > r.ratio*packed {
		return fmt.Errorf("%w: object %d of %d, a %s, declares %d bytes from %d bytes compressed (at most %d times, for objects over %d bytes)",
			ErrOutOfProportion, pc.lastI+1, pc.count, oh.Type, oh.Length, packed, r.ratio, r.ratioFloor)
	}
	return nil
}

// delta counts the size of the object delta i makes (its header's second
// size) and reads it into nothing.
func (pc *packCheck) delta(i uint32, sc *packfile.Scanner) error {
	rc, err := sc.ReadObject()
	if err != nil {
		return err
	}
	target, err := deltaTargetSize(rc)
	if err == nil {
		err = pc.add(target, fmt.Sprintf("object %d of %d: a delta making %d bytes", i+1, pc.count, target))
	}
	if err == nil {
		_, err = io.Copy(io.Discard, rc)
	}
	if cerr := rc.Close(); err == nil {
		err = cerr
	}
	return err
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
