package workspace

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWaitHeld: exec's wait for the held file ends when the file appears,
// on a stop while it has not (nothing is unpacked then), or at its bound;
// a stop that comes once the file is there is kept for after the unpack.
func TestWaitHeld(t *testing.T) {
	t.Parallel()
	held := filepath.Join(t.TempDir(), "held")
	stop := make(chan os.Signal, 1)

	require.Equal(t, heldTimedOut, waitHeld(fileExists(held), 20*time.Millisecond, stop))

	stop <- syscall.SIGTERM
	require.Equal(t, heldStopped, waitHeld(fileExists(held), time.Minute, stop), "stopped before the tree was held")

	require.NoError(t, os.WriteFile(held, nil, 0o444))
	require.Equal(t, heldSeen, waitHeld(fileExists(held), time.Minute, stop))
	require.Empty(t, stop)

	// The file appears while a stop waits to be read (absent at the first
	// look, there at the look the stop makes): held wins, the stop is
	// handed back.
	stop <- syscall.SIGTERM
	looks := 0
	appears := func() bool { looks++; return looks > 1 }
	require.Equal(t, heldSeen, waitHeld(appears, time.Minute, stop))
	require.Equal(t, 2, looks)
	require.Len(t, stop, 1, "the stop is left for after the unpack")
}

// TestPreloadCapture: a waiting capture reads its snapshot once the worker
// links it in and writes the preload file (the run's agent started),
// before the signal, and captures from it what Capture captures; stopped
// before both are there, it leaves the reading to the capture.
func TestPreloadCapture(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src, "a.txt"), []byte("one\n"), 0o644))
	snap := filepath.Join(t.TempDir(), "snap.tar")
	f, err := os.Create(snap)
	require.NoError(t, err)
	_, err = Snapshot(src, f, SnapshotOptions{})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	ws := t.TempDir()
	sf, err := os.Open(snap)
	require.NoError(t, err)
	require.NoError(t, Unpack(sf, ws, UnpackOptions{}))
	require.NoError(t, sf.Close())
	require.NoError(t, os.WriteFile(filepath.Join(ws, "a.txt"), []byte("two\n"), 0o644))

	in := filepath.Join(t.TempDir(), "snapshot.tar")
	args := func() JailArgs {
		return JailArgs{Command: "capture", Snapshot: in, Dir: ws, Scratch: t.TempDir(), RunID: "p1"}
	}
	a := args()
	stop := make(chan struct{})
	pre := preloadCapture(a, stop)
	time.Sleep(3 * snapshotPoll)
	require.NoError(t, os.Link(snap, in))
	time.Sleep(3 * snapshotPoll)
	select {
	case <-pre:
		t.Fatal("loaded before the preload file")
	default:
	}
	require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(in), PreloadFile), nil, 0o444))
	var b *captureBase
	select {
	case b = <-pre:
	case <-time.After(10 * time.Second):
		t.Fatal("the snapshot was not loaded once linked in")
	}
	close(stop)
	require.NotNil(t, b)
	require.NoError(t, b.err)
	got, err := b.capture(ws, a.captureOptions())
	b.close()
	require.NoError(t, err)
	want, err := Capture(ws, args().captureOptions())
	require.NoError(t, err)
	require.Equal(t, want.Patch, got.Patch)
	require.Equal(t, want.Result.Files, got.Result.Files)
	require.Equal(t, 1, got.Result.FilesChanged)

	stop = make(chan struct{})
	a = args()
	a.Snapshot = filepath.Join(t.TempDir(), "never.tar")
	pre = preloadCapture(a, stop)
	close(stop)
	require.Nil(t, <-pre, "stopped before the snapshot came: nothing loaded")
}
