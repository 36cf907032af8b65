package usage_test

import (
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/usage"
)

// fixture returns the bytes of testdata/name.
func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return b
}

// results records the Results a wrapped body reports.
type results struct {
	mu    sync.Mutex
	calls []usage.Result
}

// done is a Wrap done func.
func (r *results) done(res usage.Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, res)
}

// count returns how many times done was called.
func (r *results) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

// only asserts done was called exactly once and returns its Result.
func (r *results) only(t testing.TB) usage.Result {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	require.Len(t, r.calls, 1, "done must be called exactly once")
	return r.calls[0]
}

// chunks is a reader that returns at most the next of sizes bytes per
// Read (cycling through sizes), the way a network connection splits a
// body at any byte.
type chunks struct {
	data  []byte
	sizes func() int
}

// Read implements io.Reader.
func (c *chunks) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := min(c.sizes(), len(p), len(c.data))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

// oneByte returns 1 for every read.
func oneByte() int { return 1 }

// randomSizes returns read sizes from 1 to 300 bytes drawn from seed.
func randomSizes(seed uint64) func() int {
	r := rand.New(rand.NewPCG(seed, seed))
	return func() int { return 1 + r.IntN(300) }
}

// wrapRead wraps a body that yields data in reads of sizes, reads it all,
// closes it, checks every byte passed unchanged and done was called once,
// and returns the Result.
func wrapRead(t testing.TB, format string, req usage.Request, status int, ct string, data []byte, sizes func() int, maxJSON int64) usage.Result {
	t.Helper()
	var rec results
	body := usage.Wrap(format, req, status, ct, io.NopCloser(&chunks{data: data, sizes: sizes}), maxJSON, rec.done)
	got, err := io.ReadAll(body)
	require.NoError(t, err)
	require.Equal(t, data, got, "the body must pass through unchanged")
	require.NoError(t, body.Close())
	return rec.only(t)
}

// whole returns one read of everything.
func whole() int { return 1 << 30 }

// requestInfo is what ReadRequest says of a request, without its bounds:
// its Request and the body to send upstream.
func requestInfo(format, path string, body io.ReadCloser, max int64) (usage.Request, io.ReadCloser) {
	req, _, rb := usage.ReadRequest(format, path, body, max)
	return req, rb
}
