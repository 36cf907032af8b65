package tree

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// A sweep while a git fetch is in flight spares the fetch's directory
// under StateDir/ws, which the resolution holds, however old it looks,
// and removes an unheld git directory a crashed fetch left; the
// resolution then completes, and its directory goes when it ends.
func TestSweepSparesALiveGitFetch(t *testing.T) {
	t.Parallel()
	g := workertest.StartGitServer(t)
	g.NewRepo(t, "repo", map[string]string{"README": "hi\n"})
	js, err := jetstream.New(workertest.Connect(t, workertest.StartServer(t)))
	require.NoError(t, err)
	stateDir := t.TempDir()
	trees := New(Deps{Config: Config{}.WithDefaults(1), JS: js, StateDir: stateDir, Holds: &stage.Holds{}, Log: zerolog.Nop()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	trees.Start(ctx)
	defer trees.Stop(ctx)

	wsDir := filepath.Join(stateDir, "ws")
	stale := filepath.Join(wsDir, "git-1234")
	require.NoError(t, os.MkdirAll(filepath.Join(stale, "jetcrew-git-5678", "objects", "pack"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(stale, "snapshot.tar"), []byte("left by a crash"), 0o600))
	hourAgo := time.Now().Add(-time.Hour)

	release := g.HoldFetches(t)
	type result struct {
		res gitResolution
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := trees.resolveGit(ctx, messages.GitSource{URL: g.URL + "/repo", Ref: "main"})
		done <- result{res, err}
	}()
	require.Eventually(t, func() bool { return g.UploadPacks.Load() == 1 }, 20*time.Second, 5*time.Millisecond, "the fetch never reached the server")
	entries, err := filepath.Glob(filepath.Join(wsDir, "git-*"))
	require.NoError(t, err)
	require.Len(t, entries, 2, "the stale directory and the live fetch's")
	live := entries[0]
	if live == stale {
		live = entries[1]
	}
	require.True(t, trees.holds.Held(holdGitFile+live), "the resolution holds its directory")
	// Both look old: only the hold spares the live one.
	for _, d := range []string{stale, live} {
		require.NoError(t, os.Chtimes(d, hourAgo, hourAgo))
	}

	trees.Sweep(time.Minute)
	require.NoDirExists(t, stale, "an unheld git directory is removed")
	require.DirExists(t, live, "the live fetch's directory is spared")

	release()
	r := <-done
	require.NoError(t, r.err)
	require.True(t, r.res.fetched)
	require.NotEmpty(t, r.res.commit)
	require.NoDirExists(t, live, "the resolution removes its directory when it ends")
	require.False(t, trees.holds.Held(holdGitFile+live))
}
