package workspace_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/workspace"
)

// TestCaptureObjectNamedFiles: work tree files whose paths look like a
// .git's object files (a loose object's "ab/<38 hex>", a pack's
// "pack/pack-<40 hex>.pack") are the submitter's files like any other: a
// run that leaves them unchanged changes nothing, in a git snapshot and in
// a plain one.
func TestCaptureObjectNamedFiles(t *testing.T) {
	t.Parallel()
	for _, git := range []bool{true, false} {
		src := t.TempDir()
		if git {
			src = testRepo(t)
		}
		loose := "ab/" + strings.Repeat("c", 38)
		pack := "pack/pack-" + strings.Repeat("d", 40) + ".pack"
		write(t, src, loose, "a cache entry\n")
		write(t, src, pack, "not a pack\n")
		if git {
			gitCmd(t, src, "add", "-A")
			gitCmd(t, src, "commit", "-qm", "object-named files")
		}
		snap, _ := snapshotFile(t, src)
		ws := unpackFile(t, snap)
		c, err := workspace.Capture(ws, workspace.CaptureOptions{RunID: "r", Snapshot: snap, Scratch: t.TempDir()})
		require.NoError(t, err, "git %v", git)
		require.Empty(t, string(c.Patch), "git %v: nothing changed", git)
		require.Zero(t, c.Result.FilesChanged, "git %v", git)
	}
}
