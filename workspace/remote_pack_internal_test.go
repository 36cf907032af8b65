package workspace

import (
	"bytes"
	"compress/zlib"
	"crypto/rand"
	"crypto/sha1"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/stretchr/testify/require"
)

// testPack builds a pack of entries (each a header and zlib data).
type testPack struct {
	entries [][]byte
}

// object adds a whole object of type t, its header declaring size bytes,
// its data inflating to content.
func (p *testPack) object(t plumbing.ObjectType, size int64, content []byte) {
	var b bytes.Buffer
	writeEntryHeader(&b, t, size)
	b.Write(deflate(content))
	p.entries = append(p.entries, b.Bytes())
}

// refDelta adds a delta against base whose data (delta) is declared as it is.
func (p *testPack) refDelta(base plumbing.Hash, delta []byte) {
	var b bytes.Buffer
	writeEntryHeader(&b, plumbing.REFDeltaObject, int64(len(delta)))
	b.Write(base[:])
	b.Write(deflate(delta))
	p.entries = append(p.entries, b.Bytes())
}

func (p *testPack) bytes() []byte {
	var b bytes.Buffer
	b.WriteString("PACK")
	_ = binary.Write(&b, binary.BigEndian, uint32(2))
	_ = binary.Write(&b, binary.BigEndian, uint32(len(p.entries)))
	for _, e := range p.entries {
		b.Write(e)
	}
	sum := sha1.Sum(b.Bytes())
	b.Write(sum[:])
	return b.Bytes()
}

func deflate(b []byte) []byte {
	var out bytes.Buffer
	zw := zlib.NewWriter(&out)
	_, _ = zw.Write(b)
	_ = zw.Close()
	return out.Bytes()
}

// leb128 appends n as a delta header's size.
func leb128(b []byte, n uint64) []byte {
	for n >= 0x80 {
		b = append(b, byte(n)|0x80)
		n >>= 7
	}
	return append(b, byte(n))
}

// TestCheckPackCountsDeclaredSizes: the sizes a pack declares are summed
// against the cap before anything is inflated: a delta declaring a huge
// target, a pack of many empty objects (each costing packObjectCost), and
// an object declaring more than the cap all fail with ErrTooLarge; an
// object inflating past its declared size fails too; a pack within the cap
// passes.
func TestCheckPackCountsDeclaredSizes(t *testing.T) {
	t.Parallel()
	base := []byte("abc")
	baseHash := plumbing.ComputeHash(plumbing.BlobObject, base)
	ok := func(target uint64) []byte {
		d := leb128(leb128(nil, uint64(len(base))), target)
		return append(d, 0x91, 0x00, 0x03) // copy 3 bytes from offset 0
	}

	var good testPack
	good.object(plumbing.BlobObject, 3, base)
	good.refDelta(baseHash, ok(3))
	require.NoError(t, checkPack(bytes.NewReader(good.bytes()), 1<<20))
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "good.pack"))
	require.NoError(t, err)
	_, err = f.Write(good.bytes())
	require.NoError(t, err)
	_, err = indexPack(f, dir, packRules{max: 1 << 20})
	require.NoError(t, err, "go-git indexes the pack checkPack passed")
	require.NoError(t, f.Close())

	var deltaBomb testPack
	deltaBomb.object(plumbing.BlobObject, 3, base)
	deltaBomb.refDelta(baseHash, ok(1<<30))
	err = checkPack(bytes.NewReader(deltaBomb.bytes()), 64<<20)
	require.ErrorIs(t, err, ErrTooLarge)
	require.ErrorContains(t, err, "a delta making 1073741824 bytes")

	var many testPack
	for range 1000 {
		many.object(plumbing.BlobObject, 0, nil)
	}
	require.ErrorIs(t, checkPack(bytes.NewReader(many.bytes()), 100<<10), ErrTooLarge)
	require.NoError(t, checkPack(bytes.NewReader(many.bytes()), 1<<20))

	var big testPack
	big.object(plumbing.BlobObject, 1<<40, []byte("declared a terabyte"))
	require.ErrorIs(t, checkPack(bytes.NewReader(big.bytes()), 1<<30), ErrTooLarge)

	var liar testPack
	liar.object(plumbing.BlobObject, 10, make([]byte, 1<<20))
	liar.object(plumbing.BlobObject, 3, base)
	err = checkPack(bytes.NewReader(liar.bytes()), 64<<20)
	require.Error(t, err, "an object inflating past its declared size")
	require.NotErrorIs(t, err, ErrTooLarge)
}

// TestIndexPlainPack: a pack without deltas is indexed in one streamed
// pass into the index go-git's parser writes of it; a delta, an object
// out of proportion to its compressed bytes (above the floor), and an
// object inflating past its declared size are refused.
func TestIndexPlainPack(t *testing.T) {
	t.Parallel()
	rules := packRules{max: 64 << 20, ratio: MaxInflateRatio, ratioFloor: InflateRatioFloor}
	index := func(p testPack, plain bool) ([]byte, error) {
		dir := t.TempDir()
		f, err := os.Create(filepath.Join(dir, "x.pack"))
		require.NoError(t, err)
		defer f.Close()
		_, err = f.Write(p.bytes())
		require.NoError(t, err)
		var sum plumbing.Hash
		if plain {
			sum, err = indexPlainPack(f, dir, rules)
		} else {
			sum, err = indexPack(f, dir, rules)
		}
		if err != nil {
			return nil, err
		}
		return os.ReadFile(filepath.Join(dir, "pack-"+sum.String()+".idx"))
	}
	var good testPack
	good.object(plumbing.BlobObject, 3, []byte("abc"))
	good.object(plumbing.BlobObject, InflateRatioFloor, make([]byte, InflateRatioFloor))
	noise := make([]byte, 2<<20)
	_, _ = rand.Read(noise)
	good.object(plumbing.BlobObject, int64(len(noise)), noise)
	good.object(plumbing.CommitObject, 0, nil)
	plain, err := index(good, true)
	require.NoError(t, err)
	parsed, err := index(good, false)
	require.NoError(t, err)
	require.Equal(t, parsed, plain, "the index go-git's parser writes")

	var delta testPack
	delta.object(plumbing.BlobObject, 3, []byte("abc"))
	delta.refDelta(plumbing.ComputeHash(plumbing.BlobObject, []byte("abc")), []byte{3, 3, 0x91, 0, 3})
	_, err = index(delta, true)
	require.ErrorIs(t, err, ErrBadArchive)
	require.ErrorContains(t, err, "object 2 of 2 is a delta")

	var bomb testPack
	bomb.object(plumbing.BlobObject, 3, []byte("abc"))
	bomb.object(plumbing.BlobObject, InflateRatioFloor+1, make([]byte, InflateRatioFloor+1))
	_, err = index(bomb, true)
	require.ErrorIs(t, err, ErrOutOfProportion)
	require.ErrorContains(t, err, "object 2 of 2, a blob, declares 1048577 bytes from")
	_, err = index(bomb, false)
	require.ErrorIs(t, err, ErrOutOfProportion, "the same rule when go-git indexes")

	var liar testPack
	liar.object(plumbing.BlobObject, 10, make([]byte, 1<<20))
	_, err = index(liar, true)
	require.ErrorIs(t, err, ErrBadArchive, "an object inflating past its declared size")
}
