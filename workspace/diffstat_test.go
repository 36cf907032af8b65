package workspace_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/workspace"
)

// The diffstat calls binary only a change of binary
// content. An empty file added, an empty file removed, a change of mode
// alone and a rename alone are text changes of no lines (go-git reports
// every change without hunks as binary); the patch still applies.
func TestDiffstatEmptyFilesAreText(t *testing.T) {
	t.Parallel()
	src := testRepo(t)
	write(t, src, "gone-empty.txt", "")
	gitCmd(t, src, "add", "gone-empty.txt")
	gitCmd(t, src, "commit", "-qm", "an empty file")
	snap := filepath.Join(t.TempDir(), "snap.tar")
	f, err := os.Create(snap)
	require.NoError(t, err)
	_, err = workspace.Snapshot(src, f, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	ws := t.TempDir()
	sf, err := os.Open(snap)
	require.NoError(t, err)
	require.NoError(t, workspace.Unpack(sf, ws, workspace.UnpackOptions{}))
	sf.Close()

	write(t, ws, "empty.txt", "")
	require.NoError(t, os.Remove(filepath.Join(ws, "gone-empty.txt")))
	require.NoError(t, os.Chmod(filepath.Join(ws, "main.go"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "blob.bin"), []byte{0, 1, 2, 255}, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "zero.bin"), []byte{0}, 0o644))

	c, err := workspace.Capture(ws, workspace.CaptureOptions{RunID: "e1", Snapshot: snap, Scratch: t.TempDir()})
	require.NoError(t, err)
	got := map[string]messages.FileStat{}
	for _, fs := range c.Result.Files {
		got[fs.Path] = fs
	}
	require.Equal(t, map[string]messages.FileStat{
		"empty.txt":      {Path: "empty.txt"},
		"gone-empty.txt": {Path: "gone-empty.txt"},
		"main.go":        {Path: "main.go"},
		"blob.bin":       {Path: "blob.bin", Binary: true},
		"zero.bin":       {Path: "zero.bin", Binary: true},
	}, got)

	patch := filepath.Join(t.TempDir(), "p.diff")
	require.NoError(t, os.WriteFile(patch, c.Patch, 0o644))
	gitCmd(t, src, "apply", patch)
	st, err := os.Stat(filepath.Join(src, "empty.txt"))
	require.NoError(t, err)
	require.Zero(t, st.Size())
	require.NoFileExists(t, filepath.Join(src, "gone-empty.txt"))
}
