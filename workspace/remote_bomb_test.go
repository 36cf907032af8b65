package workspace_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/worker/workertest"
	"github.com/jetcrew/jetcrew/workspace"
)

// bombBytes is the inflated size of the compressed bomb the remote serves:
// 256 MiB of zeros, under 1 MiB on the wire.
const bombBytes = 256 << 20

// TestRemoteFetchBombBounded: an allowed remote serving a compressed bomb
// (a blob of 256 MiB of zeros, well under the byte cap on the wire) fails
// with ErrTooLarge before the blob is inflated: the fetch allocates a small
// fraction of the blob, whatever the cap lets through the network. Not
// parallel: it measures the process's allocations.
func TestRemoteFetchBombBounded(t *testing.T) {
	g := workertest.StartGitServer(t)
	src := g.NewRepo(t, "bomb", map[string]string{"README": "a bomb\n"})
	f, err := os.Create(filepath.Join(src, "zeros.bin"))
	require.NoError(t, err)
	require.NoError(t, f.Truncate(bombBytes))
	require.NoError(t, f.Close())
	workertest.Git(t, src, "add", "zeros.bin")
	workertest.Git(t, src, "commit", "-qm", "bomb")
	workertest.Git(t, src, "repack", "-adq")

	const maxBytes = 16 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rem, err := workspace.OpenRemote(ctx, g.URL+"/bomb", workspace.RemoteOptions{MaxBytes: maxBytes, TempDir: t.TempDir()})
	require.NoError(t, err)
	defer rem.Close()
	rr, err := rem.Resolve("main")
	require.NoError(t, err)

	peak, stop := sampleHeap()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err = rem.Snapshot(ctx, rr, &bytes.Buffer{})
	runtime.ReadMemStats(&after)
	stop()
	require.ErrorIs(t, err, workspace.ErrTooLarge)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("fetch of a %d MiB bomb with a %d MiB cap: %.1f MiB allocated, peak heap %.1f MiB above the start (%v)",
		bombBytes>>20, maxBytes>>20, float64(allocated)/(1<<20), float64(peak.Load()-int64(before.HeapAlloc))/(1<<20), err)
	require.Less(t, allocated, uint64(maxBytes), "the bomb was not inflated into memory")
}

// sampleHeap samples the heap in use every millisecond until stop and
// returns its peak.
func sampleHeap() (peak *atomic.Int64, stop func()) {
	peak = new(atomic.Int64)
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if int64(m.HeapAlloc) > peak.Load() {
				peak.Store(int64(m.HeapAlloc))
			}
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return peak, func() { close(done); <-ended }
}
