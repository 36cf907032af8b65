package workspace

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/storage/filesystem"
	"github.com/stretchr/testify/require"
)

// TestCaptureStoreKnowsWhatScratchHolds loads a snapshot whose history is
// part packed, part loose into a captureStore, spills objects past its
// memory bound, and checks that HasEncodedObject, which never asks the
// scratch directory, answers as go-git's storage of it does, for every
// object there and for objects nowhere.
func TestCaptureStoreKnowsWhatScratchHolds(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	git := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
			"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@x", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@x")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	git("init", "-q", "-b", "main")
	for i := range 20 {
		// Small files are packed, large ones (minLooseFileBytes) travel
		// loose.
		content := fmt.Sprintf("file %d\n", i)
		if i%4 == 0 {
			b := make([]byte, 4000)
			_, _ = rand.Read(b)
			content = hex.EncodeToString(b)
		}
		require.NoError(t, os.WriteFile(filepath.Join(src, fmt.Sprintf("f%d.txt", i)), []byte(content), 0o644))
	}
	git("add", "-A")
	git("commit", "-qm", "one")
	snap := filepath.Join(t.TempDir(), "snap.tar")
	f, err := os.Create(snap)
	require.NoError(t, err)
	_, err = Snapshot(src, f, SnapshotOptions{})
	require.NoError(t, err)
	require.NoError(t, f.Close())

	scratch := t.TempDir()
	fs := filesystem.NewStorage(osfs.New(scratch, osfs.WithBoundOS()), cache.NewObjectLRUDefault())
	defer fs.Close()
	st := newCaptureStore(fs, 64)
	_, _, isGit, err := loadBase(st, scratch, snap, refusedPaths{})
	require.NoError(t, err)
	require.True(t, isGit)
	require.NotEmpty(t, st.packs, "the snapshot has a pack")
	require.NotEmpty(t, st.loose, "the snapshot has loose objects")
	loose := len(st.loose)
	for i := range 10 { // past the bound of 64 bytes: some spill to scratch
		_, err := storeBlob(st, 20, func() (io.ReadCloser, error) {
			return io.NopCloser(strings.NewReader(fmt.Sprintf("new blob number %04d", i))), nil
		}, nil)
		require.NoError(t, err)
	}
	require.NotEmpty(t, st.mem)
	require.Greater(t, len(st.loose), loose, "some new blobs spilled to scratch")

	iter, err := fs.IterEncodedObjects(plumbing.AnyObject)
	require.NoError(t, err)
	n := 0
	require.NoError(t, iter.ForEach(func(o plumbing.EncodedObject) error {
		n++
		require.NoError(t, st.HasEncodedObject(o.Hash()), "%s is in scratch", o.Hash())
		return nil
	}))
	require.Greater(t, n, 20)
	for h := range st.mem {
		require.NoError(t, st.HasEncodedObject(h))
		require.ErrorIs(t, fs.HasEncodedObject(h), plumbing.ErrObjectNotFound, "held in memory only")
	}
	for _, h := range []string{"0000000000000000000000000000000000000001", "ffffffffffffffffffffffffffffffffffffffff"} {
		require.ErrorIs(t, st.HasEncodedObject(plumbing.NewHash(h)), plumbing.ErrObjectNotFound)
		require.ErrorIs(t, fs.HasEncodedObject(plumbing.NewHash(h)), plumbing.ErrObjectNotFound)
	}
}
