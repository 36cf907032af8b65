package workspace_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/worker/workertest"
	"github.com/jetcrew/jetcrew/workspace"
)

// Publish pushes a run's head (its commits and the commit of what it left
// uncommitted, on the submitter's history) to a new branch; publishing
// again is a no-op; a branch that moved is refused, and replaced with
// Force; a chain of runs pushes every run's commits.
func TestPublish(t *testing.T) {
	t.Parallel()
	g := workertest.StartPushServer(t, "bot", "s3cret-token")
	url, remote := g.URL, g.NewBare(t, "r")

	src := testRepo(t)
	s0, info0 := snapshotFile(t, src)
	ws1 := unpackFile(t, s0)
	write(t, ws1, "sub/a.txt", "run1\n")
	gitCmd(t, ws1, "commit", "-qam", "run1")
	write(t, ws1, "main.go", "package main\n")
	c1, err := workspace.Capture(ws1, workspace.CaptureOptions{RunID: "r1", Snapshot: s0, Scratch: t.TempDir()})
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := workspace.PublishOptions{Repo: src, Bundle: c1.Bundle, RunID: "r1", URL: url + "/r.git", Username: "bot", Token: "s3cret-token", Branch: "feature/r1"}
	p, err := workspace.Publish(ctx, o)
	require.NoError(t, err)
	require.Equal(t, c1.Result.Head, p.Commit.String())
	require.True(t, p.Old.IsZero())
	require.Equal(t, c1.Result.Head, gitCmd(t, remote, "rev-parse", "refs/heads/feature/r1"))
	require.Equal(t, "jetcrew: changes run r1 left uncommitted\nrun1\nsecond\nfirst", gitCmd(t, remote, "log", "--format=%s", "feature/r1"))
	gitCmd(t, remote, "fsck", "--strict")
	require.Equal(t, "main", gitCmd(t, src, "branch", "--format=%(refname:short)"), "nothing written to the submitter's repository")
	p, err = workspace.Publish(ctx, o)
	require.NoError(t, err)
	require.True(t, p.UpToDate)

	// Wrong credentials, a URL with credentials, a bad branch: refused.
	bad := o
	bad.Token = "wrong"
	_, err = workspace.Publish(ctx, bad)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "wrong")
	bad = o
	bad.URL = strings.Replace(url, "http://", "http://bot:s3cret-token@", 1) + "/r.git"
	_, err = workspace.Publish(ctx, bad)
	require.ErrorContains(t, err, "holds credentials")
	require.NotContains(t, err.Error(), "s3cret-token")
	bad = o
	bad.Branch = "a..b"
	_, err = workspace.Publish(ctx, bad)
	require.ErrorContains(t, err, "not a valid branch name")

	// Someone pushes to the branch: publishing there again is refused,
	// then forced.
	other := t.TempDir()
	gitCmd(t, other, "clone", "-q", remote, ".")
	gitCmd(t, other, "checkout", "-q", info0.Head)
	write(t, other, "x.txt", "someone else\n")
	gitCmd(t, other, "add", "x.txt")
	gitCmd(t, other, "commit", "-qm", "someone else")
	gitCmd(t, other, "push", "-q", "-f", "origin", "HEAD:refs/heads/feature/r1")
	moved := gitCmd(t, remote, "rev-parse", "refs/heads/feature/r1")
	_, err = workspace.Publish(ctx, o)
	require.ErrorIs(t, err, workspace.ErrBranchMoved)
	require.Equal(t, moved, gitCmd(t, remote, "rev-parse", "refs/heads/feature/r1"), "not overwritten")
	o.Force = true
	p, err = workspace.Publish(ctx, o)
	require.NoError(t, err)
	require.True(t, p.Forced)
	require.Equal(t, moved, p.Old.String())
	require.Equal(t, c1.Result.Head, gitCmd(t, remote, "rev-parse", "refs/heads/feature/r1"))
	o.Force = false

	// A run from r1: pushed on top, a fast-forward of feature/r1.
	s1, _ := derive(t, s0, c1.Bundle, "r1")
	ws2 := unpackFile(t, s1)
	write(t, ws2, "sub/a.txt", "run2\n")
	gitCmd(t, ws2, "commit", "-qam", "run2")
	c2, err := workspace.Capture(ws2, workspace.CaptureOptions{RunID: "r2", Snapshot: s1, Scratch: t.TempDir()})
	require.NoError(t, err)
	o.Earlier, o.Bundle, o.RunID = [][]byte{c1.Bundle}, c2.Bundle, "r2"
	p, err = workspace.Publish(ctx, o)
	require.NoError(t, err)
	require.False(t, p.Forced)
	require.Equal(t, c1.Result.Head, p.Old.String())
	require.Equal(t, "run2\njetcrew: changes run r1 left uncommitted\nrun1\nsecond\nfirst", gitCmd(t, remote, "log", "--format=%s", "feature/r1"))
	gitCmd(t, remote, "fsck", "--strict")
}
