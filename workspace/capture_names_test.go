package workspace_test

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/workspace"
)

// TestCaptureLeavesOutBadNames: a run that leaves names git cannot hold
// safely (C0 controls, DEL, a ".git" component in another spelling) in its
// work tree, in one of its own commits, among its artifacts and beside an
// untracked file of the same kind submitted with the workspace, still gets
// its commits, its patch and its artifacts: only those paths are left out,
// listed in the result's refused names, and the result says so. The bundle
// verifies and applies, the patch applies, and the run's commit keeps its
// message.
func TestCaptureLeavesOutBadNames(t *testing.T) {
	t.Parallel()
	src := testRepo(t)
	write(t, src, "sub\x1bmitted.txt", "untracked, submitted\n")
	snap := filepath.Join(t.TempDir(), "snap.tar")
	f, err := os.Create(snap)
	require.NoError(t, err)
	info, err := workspace.Snapshot(src, f, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	ws := t.TempDir()
	sf, err := os.Open(snap)
	require.NoError(t, err)
	require.NoError(t, workspace.Unpack(sf, ws, workspace.UnpackOptions{}))
	sf.Close()

	// The run: one commit holding a newline name beside a good change, then
	// uncommitted files with bad names beside a good change, and artifacts.
	write(t, ws, "sub/a.txt", "a\nb\nrun\n")
	write(t, ws, "com\nmitted.txt", "committed by the run\n")
	gitCmd(t, ws, "add", "-A")
	gitCmd(t, ws, "commit", "-qm", "run commit with a newline name")
	write(t, ws, "main.go", "package main\n\nfunc main() { println(\"bar\") }\n")
	write(t, ws, "esc\x1b[31mred.txt", "escape\n")
	write(t, ws, "del\x7f.txt", "delete char\n")
	write(t, ws, "d\x01ir/inner.txt", "under a bad directory\n")
	write(t, ws, "nested/.GIT/hooks/post-checkout", "#!/bin/sh\necho pwned\n")
	write(t, ws, "git~1/config", "[core]\n")
	write(t, ws, messages.ArtifactsDir+"/report.txt", "42\n")
	write(t, ws, messages.ArtifactsDir+"/bad\nname.txt", "x\n")

	c, err := workspace.Capture(ws, workspace.CaptureOptions{RunID: "n1", Snapshot: snap, Scratch: t.TempDir()})
	require.NoError(t, err, "one bad name must not lose the whole result")
	require.Equal(t, info.Head, c.Result.Base)
	require.Equal(t, 2, c.Result.Commits, "the run's commit and one for its uncommitted changes")
	require.ElementsMatch(t, []string{
		"com\nmitted.txt", "esc\x1b[31mred.txt", "del\x7f.txt", "d\x01ir", "nested/.GIT", "git~1",
		messages.ArtifactsDir + "/bad\nname.txt", "sub\x1bmitted.txt",
	}, c.Result.Refused)
	require.Equal(t, len(c.Result.Refused), c.Result.RefusedCount)
	require.Contains(t, c.Result.Error, "8 paths left out")
	// The record travels to the worker as it is.
	var stream bytes.Buffer
	require.NoError(t, workspace.WriteCaptureStream(&stream, c))
	cs, err := workspace.ReadCaptureStream(bytes.NewReader(stream.Bytes()), int64(stream.Len()), 0)
	require.NoError(t, err)
	require.Equal(t, c.Result, cs.Result)

	paths := map[string]bool{}
	for _, fs := range c.Result.Files {
		paths[fs.Path] = true
	}
	require.Equal(t, map[string]bool{"sub/a.txt": true, "main.go": true}, paths, "only the good changes")
	require.Len(t, c.Result.Artifacts, 1)
	require.Equal(t, "report.txt", c.Result.Artifacts[0].Name)
	require.Equal(t, []string{"report.txt"}, tarList(t, c.Artifacts))

	// The bundle lands, git verifies it, the run's commit keeps its message
	// and no tree holds a refused name.
	ref, head, err := workspace.ApplyBundle(src, c.Bundle, "n1")
	require.NoError(t, err)
	require.Equal(t, "refs/heads/jetcrew/n1", ref.String())
	require.Equal(t, c.Result.Head, head.String())
	bpath := filepath.Join(t.TempDir(), "b.bundle")
	require.NoError(t, os.WriteFile(bpath, c.Bundle, 0o644))
	gitCmd(t, src, "bundle", "verify", bpath)
	require.Equal(t, "jetcrew: changes run n1 left uncommitted\nrun commit with a newline name\nsecond\nfirst", gitCmd(t, src, "log", "--format=%s", "jetcrew/n1"))
	require.Equal(t, ".gitignore\nbig.txt\nmain.go\nnew.txt\nsub/a.txt", gitCmd(t, src, "ls-tree", "-r", "--name-only", "jetcrew/n1"))
	require.Equal(t, ".gitignore\nbig.txt\nmain.go\nnew.txt\nsub/a.txt", gitCmd(t, src, "ls-tree", "-r", "--name-only", "jetcrew/n1~1"))
	gitCmd(t, src, "fsck", "--strict")

	// The patch applies to the work tree it was submitted from.
	patch := filepath.Join(t.TempDir(), "p.diff")
	require.NoError(t, os.WriteFile(patch, c.Patch, 0o644))
	gitCmd(t, src, "apply", patch)
	b, err := os.ReadFile(filepath.Join(src, "sub/a.txt"))
	require.NoError(t, err)
	require.Equal(t, "a\nb\nrun\n", string(b))
}

// TestCaptureCarriesBadNamesOfTheBase: a hand-made snapshot whose HEAD
// commit already holds a bad name (jetcrew submit would refuse it) keeps
// that entry as the base had it, in the run's commits and in the commit of
// its uncommitted changes: the bundle never deletes what the run did not.
func TestCaptureCarriesBadNamesOfTheBase(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	gitCmd(t, src, "init", "-q", "-b", "main")
	write(t, src, "a.txt", "one\n")
	write(t, src, "b\x1bad.txt", "base's\n")
	gitCmd(t, src, "add", "-A")
	gitCmd(t, src, "commit", "-qm", "base with a bad name")
	snap := filepath.Join(t.TempDir(), "hand.tar")
	out, err := exec.Command("tar", "-cf", snap, "-C", src, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	ws := t.TempDir()
	sf, err := os.Open(snap)
	require.NoError(t, err)
	require.NoError(t, workspace.Unpack(sf, ws, workspace.UnpackOptions{}))
	sf.Close()
	write(t, ws, "a.txt", "two\n")
	gitCmd(t, ws, "commit", "-qam", "run commit")
	write(t, ws, "b\x1bad.txt", "changed by the run\n")
	write(t, ws, "c.txt", "new\n")

	c, err := workspace.Capture(ws, workspace.CaptureOptions{RunID: "cb", Snapshot: snap, Scratch: t.TempDir()})
	require.NoError(t, err)
	require.Equal(t, []string{"b\x1bad.txt"}, c.Result.Refused)
	require.Equal(t, 2, c.Result.Commits)
	require.Contains(t, string(c.Patch), "-one\n+two\n")
	require.Contains(t, string(c.Patch), "+new\n")
	_, _, err = workspace.ApplyBundle(src, c.Bundle, "cb")
	require.NoError(t, err)
	require.Empty(t, gitCmd(t, src, "diff", "--name-only", "main", "jetcrew/cb", "--", "b\x1bad.txt"), "the base's entry is kept")
	require.Equal(t, "base's\n", gitCmd(t, src, "show", "jetcrew/cb:b\x1bad.txt")+"\n")
}

// tarList lists the names of the tar b.
func tarList(t *testing.T, b []byte) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		out = append(out, h.Name)
	}
}
