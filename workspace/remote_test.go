package workspace_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/worker/workertest"
	"github.com/jetcrew/jetcrew/workspace"
)

// A commit fetched from a git remote (a loopback git http-backend) becomes
// the very snapshot Snapshot makes of a clean clone of it (every object in
// a pack, as a clone over a transport makes it: --no-local): same bytes,
// same digest. Branch, tag and HEAD resolve; a missing ref and the byte bound
// fail with their errors.
func TestRemoteSnapshotEqualsCloneSnapshot(t *testing.T) {
	t.Parallel()
	g := workertest.StartGitServer(t)
	src := g.NewRepo(t, "r", map[string]string{
		"a.txt": "a\n", "a/b.txt": "b\n", "run.sh*": "#!/bin/sh\necho hi\n", ".gitignore": "*.log\n", "keep.log": "tracked, ignored\n",
	})
	require.NoError(t, os.Symlink("a/b.txt", filepath.Join(src, "link")))
	workertest.Git(t, src, "add", "-Af")
	workertest.Git(t, src, "commit", "-qm", "second")
	workertest.Git(t, src, "tag", "-a", "v1", "-m", "v1")
	workertest.Git(t, src, "checkout", "-qb", "other")
	require.NoError(t, os.WriteFile(filepath.Join(src, "other.txt"), []byte("o\n"), 0o644))
	workertest.Git(t, src, "add", "-A")
	workertest.Git(t, src, "commit", "-qm", "other")
	workertest.Git(t, src, "checkout", "-q", "main")
	head := workertest.Git(t, src, "rev-parse", "main")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rem, err := workspace.OpenRemote(ctx, g.URL+"/r", workspace.RemoteOptions{})
	require.NoError(t, err)
	defer rem.Close()
	rr, err := rem.Resolve("main")
	require.NoError(t, err)
	require.Equal(t, "refs/heads/main", rr.Name.String())
	require.Equal(t, head, rr.Commit.String())
	var got bytes.Buffer
	info, err := rem.Snapshot(ctx, rr, &got)
	require.NoError(t, err)
	require.Equal(t, head, info.Head)
	require.Equal(t, 2, info.Commits)
	require.True(t, info.Git)

	clone := t.TempDir()
	workertest.Git(t, clone, "clone", "-q", "--no-local", "-b", "main", src, ".")
	var want bytes.Buffer
	winfo, err := workspace.Snapshot(clone, &want, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.Equal(t, winfo.Digest, info.Digest, "the remote's snapshot is a clean clone's")
	require.Equal(t, want.Bytes(), got.Bytes())
	names := tarNames(t, got.Bytes())
	require.Equal(t, "ref: refs/heads/main\n", names[".git/HEAD"])
	require.NotContains(t, names, "other.txt", "only the ref's history")

	// A tag: detached at its commit. HEAD: the remote's branch.
	rr, err = rem.Resolve("v1")
	require.NoError(t, err)
	require.Equal(t, workertest.Git(t, src, "rev-parse", "v1"), rr.Want.String(), "the annotated tag")
	require.Equal(t, head, rr.Commit.String(), "the commit the remote advertised as its peeled value")
	got.Reset()
	info, err = rem.Snapshot(ctx, rr, &got)
	require.NoError(t, err)
	require.Equal(t, head, info.Head)
	require.Equal(t, head+"\n", tarNames(t, got.Bytes())[".git/HEAD"])
	rr, err = rem.Resolve("")
	require.NoError(t, err)
	require.Equal(t, "refs/heads/main", rr.Name.String())

	_, err = rem.Resolve("nope")
	require.ErrorIs(t, err, workspace.ErrRefNotFound)

	// The byte bound holds on what the remote sends.
	small, err := workspace.OpenRemote(ctx, g.URL+"/r", workspace.RemoteOptions{MaxBytes: 600})
	if err == nil {
		defer small.Close()
		rr, err = small.Resolve("main")
		require.NoError(t, err)
		_, err = small.Snapshot(ctx, rr, &bytes.Buffer{})
	}
	require.ErrorIs(t, err, workspace.ErrTooLarge)

	_, err = workspace.OpenRemote(ctx, g.URL+"/missing", workspace.RemoteOptions{})
	require.ErrorIs(t, err, workspace.ErrRemoteRefused)
}

// A remote answering with a redirect is refused: the allowlist checked the
// URL asked for, and the fetch goes nowhere else.
func TestRemoteRedirectRefused(t *testing.T) {
	t.Parallel()
	g := workertest.StartGitServer(t)
	g.NewRepo(t, "r", map[string]string{"a": "a"})
	srv := &http.Server{Handler: http.RedirectHandler(g.URL+"/r/info/refs?service=git-upload-pack", http.StatusFound)}
	l := listenLoopback(t)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := workspace.OpenRemote(ctx, "http://"+l.Addr().String()+"/r", workspace.RemoteOptions{})
	require.ErrorIs(t, err, workspace.ErrRemoteRefused)
	require.Zero(t, g.Lists.Load(), "the redirect was not followed")
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return l
}
