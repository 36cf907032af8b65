package workspace_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/workspace"
)

// BenchmarkSnapshot snapshots the work tree make bench's TestWorkspace
// submits (bench/workspace_test.go's benchRepo): 1,000 files of 50 KiB
// (hex of random bytes) in ten directories, two commits rewriting every
// file, every object loose; no cache; loose: as they are (object files
// copied), packed: every object packed (the path of a repository whose
// objects are in git's packs). For CPU profiles of the snapshot:
// go test ./workspace -run XXX -bench Snapshot -cpuprofile cpu.prof
func BenchmarkSnapshot(b *testing.B) {
	dir := b.TempDir()
	gitCmd(b, dir, "init", "-q", "-b", "main")
	buf := make([]byte, 25<<10)
	for c, salt := range []string{"one\n", "two\n"} {
		for i := range 1000 {
			_, _ = rand.Read(buf)
			p := filepath.Join(dir, fmt.Sprintf("d%d", i%10), fmt.Sprintf("f%d.txt", i/10))
			require.NoError(b, os.MkdirAll(filepath.Dir(p), 0o755))
			require.NoError(b, os.WriteFile(p, []byte(salt+hex.EncodeToString(buf)), 0o644))
		}
		gitCmd(b, dir, "add", "-A")
		gitCmd(b, dir, "commit", "-qm", fmt.Sprint(c))
	}
	b.Run("loose", func(b *testing.B) {
		for b.Loop() {
			_, err := workspace.Snapshot(dir, io.Discard, workspace.SnapshotOptions{})
			require.NoError(b, err)
		}
	})
	// Every object inflated and packed, as for a repository whose
	// objects are in git's packs.
	b.Run("packed", func(b *testing.B) {
		defer workspace.SetMaxLooseObjects(0)()
		for b.Loop() {
			_, err := workspace.Snapshot(dir, io.Discard, workspace.SnapshotOptions{})
			require.NoError(b, err)
		}
	})
}
