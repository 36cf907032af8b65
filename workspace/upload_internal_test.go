package workspace

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLastSnapshotWithoutCacheDir proves a Submit without a cache directory
// records nothing: the record once landed in the caller's working
// directory ("last/<hash>"), and test runs left it in the source tree.
func TestLastSnapshotWithoutCacheDir(t *testing.T) {
	wd := t.TempDir()
	t.Chdir(wd)
	lastSnapshot{dir: "somewhere"}.record("sha256:00")
	entries, err := os.ReadDir(wd)
	require.NoError(t, err)
	require.Empty(t, entries, "a submit without a cache directory wrote into the working directory")

	cache := t.TempDir()
	l := lastSnapshot{cacheDir: cache, dir: "somewhere"}
	l.record("sha256:00")
	b, err := os.ReadFile(l.path())
	require.NoError(t, err)
	require.Equal(t, "sha256:00\n", string(b))
}
