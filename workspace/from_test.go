package workspace_test

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/workspace"
)

// snapshotFile writes the snapshot of dir to a file and returns its path.
func snapshotFile(t *testing.T, dir string) (string, workspace.Info) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "snap.tar")
	f, err := os.Create(p)
	require.NoError(t, err)
	info, err := workspace.Snapshot(dir, f, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return p, info
}

// unpackFile unpacks snapshot file p into a new directory.
func unpackFile(t *testing.T, p string) string {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, workspace.Unpack(f, dir, workspace.UnpackOptions{}))
	return dir
}

// derive runs DeriveSnapshot of snapshot file base and bundle into a file.
func derive(t *testing.T, base string, bundle []byte, runID string) (string, workspace.Info) {
	t.Helper()
	f, err := os.Open(base)
	require.NoError(t, err)
	defer f.Close()
	p := filepath.Join(t.TempDir(), "derived.tar")
	out, err := os.Create(p)
	require.NoError(t, err)
	info, err := workspace.DeriveSnapshot(f, bytes.NewReader(bundle), runID, out, workspace.FromOptions{TempDir: t.TempDir()})
	require.NoError(t, err)
	require.NoError(t, out.Close())
	return p, info
}

func readFile(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	require.NoError(t, err)
	return string(b)
}

// TestDeriveSnapshot: the snapshot built from a run's snapshot and bundle
// is the run's tree at its end: HEAD its result's head (its own commit,
// then the commit of what it left uncommitted) on the submitted branch,
// with the whole history, a clean work tree, its ignored files gone; the
// same inputs give the same bytes; and a chain of three runs applies as
// one branch holding every run's commits in order.
func TestDeriveSnapshot(t *testing.T) {
	t.Parallel()
	src := testRepo(t)
	s0, info0 := snapshotFile(t, src)

	// Run 1 commits one change and leaves another uncommitted (beside the
	// submitter's uncommitted main.go and untracked new.txt).
	ws1 := unpackFile(t, s0)
	write(t, ws1, "sub/a.txt", "a\nb\nrun1\n")
	gitCmd(t, ws1, "commit", "-qam", "run1")
	write(t, ws1, "main.go", "package main\n\nfunc main() { println(\"run1, uncommitted\") }\n")
	write(t, ws1, "x.log", "ignored, not captured\n")
	c1, err := workspace.Capture(ws1, workspace.CaptureOptions{RunID: "r1", Snapshot: s0, Scratch: t.TempDir()})
	require.NoError(t, err)
	require.Equal(t, info0.Head, c1.Result.Base)
	require.Equal(t, 2, c1.Result.Commits, "run1 and the commit of what it left uncommitted")

	s1, info1 := derive(t, s0, c1.Bundle, "r1")
	require.Equal(t, c1.Result.Head, info1.Head, "HEAD is the result's head")
	require.Equal(t, 4, info1.Commits, "first, second, run1, the commit of what it left uncommitted")
	again, info1b := derive(t, s0, c1.Bundle, "r1")
	require.Equal(t, info1.Digest, info1b.Digest, "equal inputs, equal bytes")
	b1, _ := os.ReadFile(s1)
	b1b, _ := os.ReadFile(again)
	require.True(t, bytes.Equal(b1, b1b))

	ws2 := unpackFile(t, s1)
	require.Equal(t, "main", gitCmd(t, ws2, "branch", "--show-current"))
	require.Equal(t, c1.Result.Head, gitCmd(t, ws2, "rev-parse", "HEAD"))
	require.Equal(t, "jetcrew: changes run r1 left uncommitted\nrun1\nsecond\nfirst", gitCmd(t, ws2, "log", "--format=%s"))
	require.Equal(t, "", gitCmd(t, ws2, "status", "--porcelain"), "a clean work tree at the result's head")
	require.Equal(t, "a\nb\nrun1\n", readFile(t, ws2, "sub/a.txt"), "the run's commit")
	require.Contains(t, readFile(t, ws2, "main.go"), "run1, uncommitted", "what it left uncommitted")
	require.Equal(t, "untracked, kept\n", readFile(t, ws2, "new.txt"), "the submitter's untracked file")
	require.NoFileExists(t, filepath.Join(ws2, "x.log"), "ignored files are not captured")
	gitCmd(t, ws2, "fsck", "--strict")

	// Run 2 commits; run 3 leaves its change uncommitted.
	write(t, ws2, "sub/a.txt", "run2\n")
	gitCmd(t, ws2, "commit", "-qam", "run2")
	c2, err := workspace.Capture(ws2, workspace.CaptureOptions{RunID: "r2", Snapshot: s1, Scratch: t.TempDir()})
	require.NoError(t, err)
	require.Equal(t, c1.Result.Head, c2.Result.Base, "a run from a run has the earlier run's head as base")
	require.Equal(t, 1, c2.Result.Commits)
	s2, info2 := derive(t, s1, c2.Bundle, "r2")
	ws3 := unpackFile(t, s2)
	require.Equal(t, info2.Head, gitCmd(t, ws3, "rev-parse", "HEAD"))
	write(t, ws3, "sub/a.txt", "run3\n")
	c3, err := workspace.Capture(ws3, workspace.CaptureOptions{RunID: "r3", Snapshot: s2, Scratch: t.TempDir()})
	require.NoError(t, err)
	require.Equal(t, 1, c3.Result.Commits)

	// The chain applies, in the submitter's repository, as one branch
	// with the runs' commits on the submitted HEAD.
	_, _, err = workspace.ApplyBundle(src, c3.Bundle, "r3")
	require.ErrorContains(t, err, "lacks the run's base commit", "alone, the last bundle lacks the earlier runs' commits")
	ref, head, err := workspace.ApplyChain(src, [][]byte{c1.Bundle, c2.Bundle}, c3.Bundle, "r3")
	require.NoError(t, err)
	require.Equal(t, "refs/heads/jetcrew/r3", ref.String())
	require.Equal(t, c3.Result.Head, head.String())
	require.Equal(t, "jetcrew: changes run r3 left uncommitted\nrun2\njetcrew: changes run r1 left uncommitted\nrun1\nsecond\nfirst",
		gitCmd(t, src, "log", "--format=%s", "jetcrew/r3"))
	require.Equal(t, "4", gitCmd(t, src, "rev-list", "--count", info0.Head+"..jetcrew/r3"))
	require.Equal(t, "jetcrew/r3\nmain", gitCmd(t, src, "branch", "--format=%(refname:short)"), "no branch for the earlier runs")
	gitCmd(t, src, "fsck", "--strict")
	_, _, err = workspace.ApplyChain(src, [][]byte{c1.Bundle, c2.Bundle}, c3.Bundle, "r3")
	require.NoError(t, err, "applying twice is a no-op")
}

// TestDeriveSnapshotRefuses: a plain directory's run, a bundle of another
// run or one whose base is not the snapshot's HEAD are refused.
func TestDeriveSnapshotRefuses(t *testing.T) {
	t.Parallel()
	src := testRepo(t)
	s0, _ := snapshotFile(t, src)
	ws1 := unpackFile(t, s0)
	gitCmd(t, ws1, "commit", "-qam", "run1")
	c1, err := workspace.Capture(ws1, workspace.CaptureOptions{RunID: "r1", Snapshot: s0, Scratch: t.TempDir()})
	require.NoError(t, err)
	try := func(base string, bundle []byte, runID string) error {
		f, err := os.Open(base)
		require.NoError(t, err)
		defer f.Close()
		_, err = workspace.DeriveSnapshot(f, bytes.NewReader(bundle), runID, &bytes.Buffer{}, workspace.FromOptions{TempDir: t.TempDir()})
		return err
	}
	require.ErrorIs(t, try(s0, c1.Bundle, "r2"), workspace.ErrBadArchive, "another run's bundle")

	plain := t.TempDir()
	write(t, plain, "a.txt", "a\n")
	sp, _ := snapshotFile(t, plain)
	require.ErrorIs(t, try(sp, c1.Bundle, "r1"), workspace.ErrNotGitSource)

	other := testRepo(t)
	gitCmd(t, other, "commit", "-qam", "elsewhere")
	so, _ := snapshotFile(t, other)
	require.ErrorIs(t, try(so, c1.Bundle, "r1"), workspace.ErrBadArchive, "a bundle on another base")

	var big bytes.Buffer
	f, err := os.Open(s0)
	require.NoError(t, err)
	defer f.Close()
	_, err = workspace.DeriveSnapshot(f, bytes.NewReader(c1.Bundle), "r1", &big, workspace.FromOptions{TempDir: t.TempDir(), MaxBytes: 4096})
	require.ErrorIs(t, err, workspace.ErrTooLarge, "objects past the cap, declared before inflating")
}

// TestDeriveSnapshotRefusesBomb: an object of a run's bundle declaring
// more than MaxInflateRatio times its compressed bytes (a file of zeros)
// is refused with ErrOutOfProportion, naming the object; one under
// InflateRatioFloor is not held to the ratio.
func TestDeriveSnapshotRefusesBomb(t *testing.T) {
	t.Parallel()
	src := testRepo(t)
	s0, _ := snapshotFile(t, src)
	capture := func(runID string, zeros int) []byte {
		ws := unpackFile(t, s0)
		write(t, ws, "zeros.bin", string(make([]byte, zeros)))
		c, err := workspace.Capture(ws, workspace.CaptureOptions{RunID: runID, Snapshot: s0, Scratch: t.TempDir()})
		require.NoError(t, err)
		return c.Bundle
	}
	try := func(bundle []byte, runID string) error {
		f, err := os.Open(s0)
		require.NoError(t, err)
		defer f.Close()
		_, err = workspace.DeriveSnapshot(f, bytes.NewReader(bundle), runID, &bytes.Buffer{}, workspace.FromOptions{TempDir: t.TempDir()})
		return err
	}
	err := try(capture("bomb", 8<<20), "bomb")
	require.ErrorIs(t, err, workspace.ErrOutOfProportion)
	require.ErrorContains(t, err, "declares 8388608 bytes from")
	require.NoError(t, try(capture("small", workspace.InflateRatioFloor), "small"), "at the floor, any ratio")
}

// TestDeriveSnapshotStreamsObjects: a run's bundle holding a 48 MiB file
// (compressible, within MaxInflateRatio) is indexed and its file written
// into the snapshot without the object ever held in memory whole: the
// heap grows by a fraction of it. Not parallel: it measures the process's
// heap.
func TestDeriveSnapshotStreamsObjects(t *testing.T) {
	const size = 48 << 20
	src := testRepo(t)
	s0, _ := snapshotFile(t, src)
	ws := unpackFile(t, s0)
	// 64 random bytes a 4 KiB block: about 50 times smaller deflated.
	data := make([]byte, size)
	for off := 0; off < size; off += 4096 {
		_, _ = rand.Read(data[off : off+64])
	}
	require.NoError(t, os.WriteFile(filepath.Join(ws, "large.bin"), data, 0o644))
	c, err := workspace.Capture(ws, workspace.CaptureOptions{RunID: "r1", Snapshot: s0, Scratch: t.TempDir()})
	require.NoError(t, err)
	data = nil
	t.Logf("bundle: %d bytes for a %d MiB file", len(c.Bundle), size>>20)

	f, err := os.Open(s0)
	require.NoError(t, err)
	defer f.Close()
	out, err := os.Create(filepath.Join(t.TempDir(), "derived.tar"))
	require.NoError(t, err)
	defer out.Close()
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	peak, stop := sampleHeap()
	info, err := workspace.DeriveSnapshot(f, bytes.NewReader(c.Bundle), "r1", out, workspace.FromOptions{TempDir: t.TempDir()})
	stop()
	require.NoError(t, err)
	grew := peak.Load() - int64(before.HeapAlloc)
	t.Logf("derived %d bytes; peak heap %.1f MiB above the start", info.Size, float64(grew)/(1<<20))
	require.Greater(t, info.Size, int64(size), "the file is in the snapshot")
	require.Less(t, grew, int64(16<<20), "the object was not held in memory")
}
