package workspace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/storage/memory"
	"github.com/stretchr/testify/require"
)

// TestStoreBlob: a blob is read once when small (held in memory) and twice
// when large (hashed, then stored) and once when the store holds it
// already; a file shorter than its size, or that changed between the two
// reads, is refused; admit's error is returned before anything is stored.
func TestStoreBlob(t *testing.T) {
	t.Parallel()
	for _, size := range []int64{0, 10, smallBlobBytes, smallBlobBytes + 1, 200 << 10} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			t.Parallel()
			content := bytes.Repeat([]byte("a"), int(size))
			opens := 0
			open := func(reads ...[]byte) func() (io.ReadCloser, error) {
				return func() (io.ReadCloser, error) {
					b := reads[min(opens, len(reads)-1)]
					opens++
					return io.NopCloser(bytes.NewReader(b)), nil
				}
			}
			st := memory.NewStorage()
			want := plumbing.ComputeHash(plumbing.BlobObject, content)
			denied := errors.New("over budget")
			_, err := storeBlob(st, size, open(content), func() error { return denied })
			require.ErrorIs(t, err, denied)
			require.Error(t, st.HasEncodedObject(want), "nothing stored past admit")

			opens = 0
			admitted := 0
			h, err := storeBlob(st, size, open(content), func() error { admitted++; return nil })
			require.NoError(t, err)
			require.Equal(t, want, h)
			require.NoError(t, st.HasEncodedObject(want))
			require.Equal(t, 1, admitted)
			if size > smallBlobBytes {
				require.Equal(t, 2, opens, "hashed, then stored")
			} else {
				require.Equal(t, 1, opens, "read once, into memory")
			}
			o, err := st.EncodedObject(plumbing.BlobObject, want)
			require.NoError(t, err)
			r, err := o.Reader()
			require.NoError(t, err)
			got, err := io.ReadAll(r)
			require.NoError(t, err)
			require.Equal(t, content, got)

			opens, admitted = 0, 0
			_, err = storeBlob(st, size, open(content), func() error { admitted++; return nil })
			require.NoError(t, err)
			require.Equal(t, [2]int{1, 0}, [2]int{opens, admitted}, "held already: read once, not admitted")

			if size == 0 {
				return
			}
			_, err = storeBlob(memory.NewStorage(), size, open(content[1:]), nil)
			require.EqualError(t, err, "file changed while it was read", "shorter than its size")
			if size > smallBlobBytes {
				opens = 0
				other := bytes.Repeat([]byte("b"), int(size))
				_, err = storeBlob(memory.NewStorage(), size, open(content, other), nil)
				require.EqualError(t, err, "file changed while it was read", "changed between the reads")
			}
		})
	}
}
