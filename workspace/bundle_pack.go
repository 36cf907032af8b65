package workspace

import (
	"crypto/sha1"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
)

// indexPlainPack checks the pack f, which must hold no delta (a pack
// encodePack wrote: a run's bundle), by rules, and writes its index into
// dir as pack-<checksum>.idx, in one pass: each object's declared size is
// counted before it is inflated, then it is inflated once, streamed into
// its hash, never held in memory whole (go-git's parser holds every object
// whole in turn while it indexes). It returns the pack's checksum. A delta
// or a malformed pack wraps ErrBadArchive.
func indexPlainPack(f *os.File, dir string, rules packRules) (plumbing.Hash, error) {
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return plumbing.ZeroHash, err
	}
	bad := func(err error) error { return fmt.Errorf("%w: %w", ErrBadArchive, err) }
	sc := packfile.NewScanner(f)
	_, count, err := sc.Header()
	if err != nil {
		return plumbing.ZeroHash, bad(err)
	}
	iw := new(idxfile.Writer)
	if err := iw.OnHeader(count); err != nil {
		return plumbing.ZeroHash, err
	}
	rules.noDeltas = true
	pc := &packCheck{rules: rules, count: count}
	for i := range count {
		oh, err := sc.NextObjectHeader()
		if err != nil {
			return plumbing.ZeroHash, bad(err)
		}
		if err := pc.object(i, oh); err != nil {
			return plumbing.ZeroHash, err
		}
		h := plumbing.NewHasher(oh.Type, oh.Length)
		n, crc, err := sc.NextObject(h)
		if err == nil && n != oh.Length {
			err = fmt.Errorf("object %d of %d inflates to %d bytes, its header says %d", i+1, count, n, oh.Length)
		}
		if err != nil {
			return plumbing.ZeroHash, bad(err)
		}
		iw.Add(h.Sum(), uint64(oh.Offset), crc)
	}
	if err := pc.proportion(end - sha1.Size); err != nil {
		return plumbing.ZeroHash, err
	}
	sum, err := sc.Checksum()
	if err != nil {
		return plumbing.ZeroHash, bad(err)
	}
	if err := iw.OnFooter(sum); err != nil {
		return plumbing.ZeroHash, err
	}
	return sum, writePackIndex(iw, dir, sum)
}

// writePackIndex writes the index iw built into dir as
// pack-<sum>.idx, a new file.
func writePackIndex(iw *idxfile.Writer, dir string, sum plumbing.Hash) error {
	idx, err := iw.Index()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(filepath.Join(dir, "pack-"+sum.String()+".idx"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = idxfile.NewEncoder(out).Encode(idx)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
