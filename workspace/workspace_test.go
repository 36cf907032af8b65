package workspace_test

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/workspace"
)

// gitCmd runs git in dir with a fixed identity and no user or system
// config, and returns its trimmed output.
func gitCmd(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@x", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@x")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "git %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
}

// testRepo makes a git repository with two commits, an ignored file, an
// untracked file and an uncommitted change. Its objects are loose; one,
// big.txt's blob, in a file large enough to travel as it is.
func testRepo(t *testing.T) string {
	dir := t.TempDir()
	gitCmd(t, dir, "init", "-q", "-b", "main")
	write(t, dir, "big.txt", randomText(t, 8192))
	write(t, dir, ".gitignore", "*.log\nbuild/\n")
	write(t, dir, "main.go", "package main\n\nfunc main() { println(\"foo\") }\n")
	write(t, dir, "sub/a.txt", "a\n")
	gitCmd(t, dir, "add", "-A")
	gitCmd(t, dir, "commit", "-qm", "first")
	write(t, dir, "sub/a.txt", "a\nb\n")
	gitCmd(t, dir, "commit", "-qam", "second")
	write(t, dir, "debug.log", "ignored\n")
	write(t, dir, "build/out.bin", "ignored\n")
	write(t, dir, "new.txt", "untracked, kept\n")
	write(t, dir, "main.go", "package main\n\nfunc main() { println(\"foo\", 1) }\n")
	return dir
}

func tarNames(t *testing.T, b []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		c, _ := io.ReadAll(tr)
		out[h.Name] = string(c)
	}
}

func TestSnapshotGitWorkTree(t *testing.T) {
	t.Parallel()
	dir := testRepo(t)
	var b bytes.Buffer
	info, err := workspace.Snapshot(dir, &b, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.True(t, info.Git)
	require.Equal(t, gitCmd(t, dir, "rev-parse", "HEAD"), info.Head)
	require.Equal(t, 2, info.Commits)
	require.EqualValues(t, b.Len(), info.Size)
	names := tarNames(t, b.Bytes())
	require.Len(t, looseNames(names), 1, "big.txt's blob as a loose object file")
	require.Len(t, packNames(names), 2, "the other objects in a pack")
	require.Contains(t, names, "new.txt", "untracked, not ignored: kept")
	require.Contains(t, names["main.go"], "\"foo\", 1", "uncommitted change kept")
	require.NotContains(t, names, "debug.log")
	require.NotContains(t, names, "build/out.bin")
	require.Equal(t, "ref: refs/heads/main\n", names[".git/HEAD"])
	require.NotContains(t, names[".git/config"], "hooks")

	// Deterministic: the same tree gives the same bytes, whatever the times.
	now := b.Bytes()
	require.NoError(t, os.Chtimes(filepath.Join(dir, "new.txt"), epochPlus(), epochPlus()))
	var b2 bytes.Buffer
	info2, err := workspace.Snapshot(dir, &b2, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.Equal(t, info.Digest, info2.Digest)
	require.Equal(t, now, b2.Bytes())

	// The unpacked snapshot is a repository git reads: history present,
	// the uncommitted change shows as a change, ignored files absent.
	out := t.TempDir()
	require.NoError(t, workspace.Unpack(bytes.NewReader(now), out, workspace.UnpackOptions{}))
	require.Equal(t, "second\nfirst", gitCmd(t, out, "log", "--format=%s"))
	require.Equal(t, "M main.go\n?? new.txt", gitCmd(t, out, "status", "--porcelain"))
	gitCmd(t, out, "fsck", "--strict")
}

// TestSnapshotCache: a second snapshot of the same HEAD takes the packed
// history, the index file and the list of loose objects from the cache and
// gives the same bytes; an entry with a damaged pack, or listing a loose
// object the repository no longer has loose, is rebuilt, never used.
func TestSnapshotCache(t *testing.T) {
	t.Parallel()
	dir := testRepo(t)
	gitCmd(t, dir, "gc", "-q")
	write(t, dir, "big.txt", randomText(t, 8192))
	gitCmd(t, dir, "add", "big.txt")
	gitCmd(t, dir, "commit", "-qam", "third: a loose object file beside the pack")
	cache := t.TempDir()
	snap := func(o workspace.SnapshotOptions) (workspace.Info, []byte) {
		var b bytes.Buffer
		info, err := workspace.Snapshot(dir, &b, o)
		require.NoError(t, err)
		return info, b.Bytes()
	}
	cached := workspace.SnapshotOptions{CacheDir: cache}
	ia, a := snap(workspace.SnapshotOptions{})
	require.Len(t, packNames(tarNames(t, a)), 2)
	require.Len(t, looseNames(tarNames(t, a)), 1, "big.txt's blob")
	_, b := snap(cached)
	base := filepath.Join(cache, ia.Head)
	for _, ext := range []string{".pack", ".idx", ".index", ".json"} {
		require.FileExists(t, base+ext)
	}
	ic, c := snap(cached)
	require.Equal(t, a, b)
	require.Equal(t, a, c)
	require.Equal(t, ia, ic)

	// The entry is used: a changed index file shows.
	tamper := func() { require.NoError(t, os.WriteFile(base+".index", []byte("from the cache"), 0o600)) }
	tamper()
	_, d := snap(cached)
	require.Equal(t, "from the cache", tarNames(t, d)[".git/index"])
	// A damaged pack: rebuilt.
	require.NoError(t, os.WriteFile(base+".pack", []byte("damaged, longer than a trailer......"), 0o600))
	_, e := snap(cached)
	require.Equal(t, a, e)
	// A listed loose object packed since: rebuilt.
	tamper()
	gitCmd(t, dir, "gc", "-q")
	_, want := snap(workspace.SnapshotOptions{})
	_, f := snap(cached)
	require.Equal(t, want, f)
	require.NotEqual(t, a, f)
}

func TestSnapshotPlainDirAndLimits(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, dir, "a.txt", "hello\n")
	write(t, dir, "x.log", "plain dirs keep everything\n")
	require.NoError(t, os.Symlink("/etc/shadow", filepath.Join(dir, "link")))
	var b bytes.Buffer
	info, err := workspace.Snapshot(dir, &b, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.False(t, info.Git)
	names := tarNames(t, b.Bytes())
	require.Contains(t, names, "x.log")
	require.NotContains(t, names, ".git/HEAD")

	_, err = workspace.Snapshot(dir, io.Discard, workspace.SnapshotOptions{MaxBytes: 1024})
	require.ErrorIs(t, err, workspace.ErrTooLarge)
	out := t.TempDir()
	require.ErrorIs(t, workspace.Unpack(bytes.NewReader(b.Bytes()), out, workspace.UnpackOptions{MaxBytes: 3}), workspace.ErrTooLarge)
}

func TestUnpackRefusesHostileArchives(t *testing.T) {
	t.Parallel()
	outside := t.TempDir()
	for name, entries := range map[string][]tar.Header{
		"dotdot":        {{Name: "../x", Typeflag: tar.TypeReg}},
		"absolute":      {{Name: "/tmp/x", Typeflag: tar.TypeReg}},
		"hardlink":      {{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}},
		"device":        {{Name: "d", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}},
		"fifo":          {{Name: "f", Typeflag: tar.TypeFifo}},
		"through link":  {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside}, {Name: "l/pwned", Typeflag: tar.TypeReg}},
		"duplicate":     {{Name: "a", Typeflag: tar.TypeReg}, {Name: "a", Typeflag: tar.TypeReg}},
		"file over dir": {{Name: "a", Typeflag: tar.TypeReg}, {Name: "a/b", Typeflag: tar.TypeReg}},
	} {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range entries {
			h.Mode = 0o4755
			require.NoError(t, tw.WriteHeader(&h))
		}
		require.NoError(t, tw.Close())
		err := workspace.Unpack(bytes.NewReader(b.Bytes()), t.TempDir(), workspace.UnpackOptions{})
		require.ErrorIs(t, err, workspace.ErrBadArchive, name)
	}
	ents, err := os.ReadDir(outside)
	require.NoError(t, err)
	require.Empty(t, ents, "nothing written outside the tree")
}

// TestCaptureRoundTrip runs the whole path a run's workspace takes: snapshot,
// unpack, a "run" that commits once and leaves changes (text, binary,
// deletion, artifacts, an ignored file, a FIFO and an escaping symlink),
// capture, then git apply of the patch and apply of the bundle in the
// submitter's repository.
func TestCaptureRoundTrip(t *testing.T) {
	t.Parallel()
	src := testRepo(t)
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

	// The run: one commit, then uncommitted changes.
	write(t, ws, "sub/a.txt", "a\nb\nc\n")
	gitCmd(t, ws, "commit", "-qam", "run commit")
	write(t, ws, "main.go", "package main\n\nfunc main() { println(\"bar\", 1) }\n")
	require.NoError(t, os.Remove(filepath.Join(ws, ".gitignore")))
	write(t, ws, ".gitignore", "*.log\n")
	write(t, ws, "x.log", "ignored\n")
	require.NoError(t, os.WriteFile(filepath.Join(ws, "blob.bin"), []byte{0, 1, 2, 255, 0, 7}, 0o755))
	require.NoError(t, os.Symlink("/etc/shadow", filepath.Join(ws, "shadow")))
	require.NoError(t, exec.Command("mkfifo", filepath.Join(ws, "fifo")).Run())
	write(t, ws, messages.ArtifactsDir+"/report.txt", "42\n")
	write(t, ws, messages.SessionDir+"/-workspace/s1.jsonl", "turn 1\n")

	c, err := workspace.Capture(ws, workspace.CaptureOptions{RunID: "r1", Snapshot: snap, Scratch: t.TempDir()})
	require.NoError(t, err)
	require.Empty(t, c.Result.Error)
	require.Equal(t, info.Head, c.Result.Base)
	require.Equal(t, 2, c.Result.Commits, "the run's commit and one for its uncommitted changes")
	// Changed relative to the workspace as submitted (the submitter's
	// uncommitted main.go and untracked new.txt included): sub/a.txt (the
	// run's commit), main.go, blob.bin, shadow, .gitignore.
	paths := map[string]bool{}
	for _, fs := range c.Result.Files {
		paths[fs.Path] = true
	}
	require.Equal(t, map[string]bool{"sub/a.txt": true, "main.go": true, "blob.bin": true, "shadow": true, ".gitignore": true}, paths)
	require.NotContains(t, string(c.Patch), "x.log")
	require.NotContains(t, string(c.Patch), "report.txt")
	require.NotContains(t, string(c.Patch), "s1.jsonl", "the session is no part of the tree")
	require.Empty(t, c.Result.SessionError)
	require.Equal(t, []string{"-workspace/s1.jsonl"}, tarList(t, c.Session))
	require.Len(t, c.Result.Artifacts, 1)
	require.Equal(t, "report.txt", c.Result.Artifacts[0].Name)

	// The bundle lands as a branch in the submitter's repository without
	// touching its branch or work tree; git itself reads it too.
	before := gitCmd(t, src, "status", "--porcelain")
	ref, head, err := workspace.ApplyBundle(src, c.Bundle, "r1")
	require.NoError(t, err)
	require.Equal(t, "refs/heads/jetcrew/r1", ref.String())
	require.Equal(t, c.Result.Head, head.String())
	require.Equal(t, "main", gitCmd(t, src, "branch", "--show-current"))
	require.Equal(t, before, gitCmd(t, src, "status", "--porcelain"))
	require.Equal(t, "jetcrew: changes run r1 left uncommitted\nrun commit\nsecond\nfirst", gitCmd(t, src, "log", "--format=%s", "jetcrew/r1"))
	gitCmd(t, src, "fsck", "--strict")
	_, _, err = workspace.ApplyBundle(src, c.Bundle, "r1")
	require.NoError(t, err, "applying twice is a no-op")
	_, _, err = workspace.ApplyBundle(src, c.Bundle, "r2")
	require.ErrorContains(t, err, "not the bundle of run r2")
	bpath := filepath.Join(t.TempDir(), "b.bundle")
	require.NoError(t, os.WriteFile(bpath, c.Bundle, 0o644))
	gitCmd(t, src, "bundle", "verify", bpath)

	// git apply reads the patch, binary file included, on the workspace as
	// submitted: the submitter's own work tree.
	patch := filepath.Join(t.TempDir(), "p.diff")
	require.NoError(t, os.WriteFile(patch, c.Patch, 0o644))
	gitCmd(t, src, "apply", patch)
	b, err := os.ReadFile(filepath.Join(src, "blob.bin"))
	require.NoError(t, err)
	require.Equal(t, []byte{0, 1, 2, 255, 0, 7}, b)
	gitCmd(t, src, "add", "-A")
	require.Equal(t, "", gitCmd(t, src, "diff", "--cached", "--stat", "jetcrew/r1", "--", ".", ":!build"),
		"the patch and the branch agree (build/ was ignored at submit time, never part of the run)")
}

// TestCaptureInMemoryOrOnDisk captures one run's changes (a commit of its
// own, edits, a removal, a binary file, a symlink, an artifact) with the
// objects the capture makes held in memory, on disk, and partly each: the
// result, patch, bundle and artifacts are the same bytes. Not parallel: it
// sets the capture's memory bound and clock.
func TestCaptureInMemoryOrOnDisk(t *testing.T) {
	defer workspace.SetCaptureClock(epochPlus)()
	src := testRepo(t)
	for i := range 40 {
		write(t, src, fmt.Sprintf("pkg/%d.txt", i), strings.Repeat(fmt.Sprintf("line %d\n", i), 10+i))
	}
	gitCmd(t, src, "add", "-A")
	gitCmd(t, src, "commit", "-qm", "more")
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
	require.NoError(t, sf.Close())
	for i := range 40 {
		if i%3 == 0 {
			write(t, ws, fmt.Sprintf("pkg/%d.txt", i), fmt.Sprintf("run %d\n", i))
		}
	}
	gitCmd(t, ws, "commit", "-qam", "run commit")
	write(t, ws, "pkg/1.txt", "uncommitted\n")
	require.NoError(t, os.Remove(filepath.Join(ws, "pkg", "2.txt")))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "blob.bin"), []byte{0, 1, 2, 255, 0, 7}, 0o644))
	require.NoError(t, os.Symlink("/etc/shadow", filepath.Join(ws, "shadow")))
	write(t, ws, messages.ArtifactsDir+"/report.txt", "42\n")

	var want *workspace.Captured
	for _, bound := range []int64{0, 600, 1 << 30} {
		restore := workspace.SetCaptureMemBytes(bound)
		c, err := workspace.Capture(ws, workspace.CaptureOptions{RunID: "r1", Snapshot: snap, Scratch: t.TempDir()})
		restore()
		require.NoError(t, err)
		require.Empty(t, c.Result.Error)
		require.Equal(t, 2, c.Result.Commits)
		if want == nil {
			want = c
			continue
		}
		require.Equal(t, want.Result, c.Result, "memory bound %d", bound)
		require.Equal(t, want.Patch, c.Patch, "memory bound %d", bound)
		require.Equal(t, want.Bundle, c.Bundle, "memory bound %d", bound)
		require.Equal(t, want.Artifacts, c.Artifacts, "memory bound %d", bound)
	}
}

func TestCapturePlainDir(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	write(t, src, "a.txt", "one\n")
	snap := filepath.Join(t.TempDir(), "snap.tar")
	f, err := os.Create(snap)
	require.NoError(t, err)
	_, err = workspace.Snapshot(src, f, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	ws := t.TempDir()
	sf, _ := os.Open(snap)
	require.NoError(t, workspace.Unpack(sf, ws, workspace.UnpackOptions{}))
	sf.Close()

	// Unchanged: head is base, no patch.
	c, err := workspace.Capture(ws, workspace.CaptureOptions{RunID: "p0", Snapshot: snap, Scratch: t.TempDir()})
	require.NoError(t, err)
	require.Empty(t, c.Patch)
	require.Nil(t, c.Bundle)
	require.Zero(t, c.Result.Commits)

	write(t, ws, "a.txt", "two\n")
	c, err = workspace.Capture(ws, workspace.CaptureOptions{RunID: "p1", Snapshot: snap, Scratch: t.TempDir()})
	require.NoError(t, err)
	require.Empty(t, c.Result.Base, "a plain directory has no base commit")
	require.Equal(t, 1, c.Result.FilesChanged)
	require.Equal(t, 1, c.Result.Insertions)
	require.Equal(t, 1, c.Result.Deletions)
	require.Contains(t, string(c.Patch), "+two")
}

// TestCapture1000Files times the capture of a run that changed 1,000 files
// (reported with -v) and bounds it.
func TestCapture1000Files(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	gitCmd(t, src, "init", "-q", "-b", "main")
	for i := range 1000 {
		write(t, src, filepath.Join("pkg", strconv.Itoa(i%10), strconv.Itoa(i)+".txt"), strings.Repeat("line\n", 20)+strconv.Itoa(i)+"\n")
	}
	gitCmd(t, src, "add", "-A")
	gitCmd(t, src, "commit", "-qm", "1000 files")
	snap := filepath.Join(t.TempDir(), "snap.tar")
	f, err := os.Create(snap)
	require.NoError(t, err)
	_, err = workspace.Snapshot(src, f, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	ws := t.TempDir()
	sf, _ := os.Open(snap)
	require.NoError(t, workspace.Unpack(sf, ws, workspace.UnpackOptions{}))
	sf.Close()
	for i := range 1000 {
		write(t, ws, filepath.Join("pkg", strconv.Itoa(i%10), strconv.Itoa(i)+".txt"), strings.Repeat("line\n", 19)+"changed\n"+strconv.Itoa(i)+"\n")
	}
	start := time.Now()
	c, err := workspace.Capture(ws, workspace.CaptureOptions{RunID: "big", Snapshot: snap, Scratch: t.TempDir()})
	took := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, 1000, c.Result.FilesChanged)
	require.Equal(t, 1000, c.Result.Insertions)
	require.Equal(t, 1001, c.Result.Commits+1000, "one commit of uncommitted changes")
	// Speed is make bench's (workspace_capture_1000_files_ms), not a timed
	// assertion: under -race on a loaded machine this took 42 s once.
	t.Logf("capture of a 1,000-file change: %s (patch %d bytes, bundle %d bytes)", took, len(c.Patch), len(c.Bundle))
}

// TestCaptureHostileWorkspace plants what a hostile run could leave: a
// .git/config naming an fsmonitor, hooks and filters that would write a
// marker, a .git replaced by a symlink to a directory outside, an artifacts
// directory that is a symlink to /etc, a symlink in artifacts, and more new
// content than the cap. Capture runs none of it, reads nothing outside, and
// says what it could not use.
func TestCaptureHostileWorkspace(t *testing.T) {
	t.Parallel()
	src := testRepo(t)
	snap := filepath.Join(t.TempDir(), "snap.tar")
	f, err := os.Create(snap)
	require.NoError(t, err)
	_, err = workspace.Snapshot(src, f, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	stage := func() string {
		ws := t.TempDir()
		sf, err := os.Open(snap)
		require.NoError(t, err)
		defer sf.Close()
		require.NoError(t, workspace.Unpack(sf, ws, workspace.UnpackOptions{}))
		return ws
	}
	marker := filepath.Join(t.TempDir(), "pwned")
	evil := "#!/bin/sh\ntouch " + marker + "\n"

	ws := stage()
	write(t, ws, ".git/config", "[core]\n\tfsmonitor = "+filepath.Join(ws, "evil.sh")+"\n\thooksPath = hooks\n[filter \"x\"]\n\tclean = "+filepath.Join(ws, "evil.sh")+"\n[diff \"x\"]\n\ttextconv = "+filepath.Join(ws, "evil.sh")+"\n")
	write(t, ws, ".gitattributes", "* filter=x diff=x\n")
	for _, p := range []string{"evil.sh", "hooks/post-commit", ".git/hooks/pre-commit", ".git/hooks/post-checkout"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(ws, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(ws, p), []byte(evil), 0o755))
	}
	require.NoError(t, os.MkdirAll(filepath.Join(ws, ".jetcrew"), 0o755))
	require.NoError(t, os.Symlink("/etc", filepath.Join(ws, messages.ArtifactsDir)))
	c, err := workspace.Capture(ws, workspace.CaptureOptions{RunID: "h1", Snapshot: snap, Scratch: t.TempDir()})
	require.NoError(t, err)
	require.Empty(t, c.Result.Artifacts, "an artifacts symlink is not followed")
	require.Contains(t, string(c.Patch), "evil.sh", "hostile files are data")
	require.NoFileExists(t, marker, "nothing from the repository ran")

	// .git a symlink to a repository outside the tree: not read.
	ws = stage()
	outside := t.TempDir()
	gitCmd(t, outside, "init", "-q")
	require.NoError(t, os.RemoveAll(filepath.Join(ws, ".git")))
	require.NoError(t, os.Symlink(filepath.Join(outside, ".git"), filepath.Join(ws, ".git")))
	write(t, ws, messages.ArtifactsDir+"/ok.txt", "ok\n")
	require.NoError(t, os.Symlink("/etc/shadow", filepath.Join(ws, messages.ArtifactsDir, "shadow")))
	c, err = workspace.Capture(ws, workspace.CaptureOptions{RunID: "h2", Snapshot: snap, Scratch: t.TempDir()})
	require.NoError(t, err)
	require.Contains(t, c.Result.Error, "removed or replaced .git")
	require.Len(t, c.Result.Artifacts, 1, "a symlink among the artifacts is skipped")

	// More new content than the cap.
	ws = stage()
	write(t, ws, "big.txt", strings.Repeat("x", 4096))
	_, err = workspace.Capture(ws, workspace.CaptureOptions{RunID: "h3", Snapshot: snap, Scratch: t.TempDir(), MaxBytes: 1024})
	require.ErrorIs(t, err, workspace.ErrTooLarge)
}

// TestCaptureHandMadeTar: a snapshot made by hand (`tar -cf` of a work tree
// with its real .git: loose objects, hooks samples, its own config) is
// captured like one of jetcrew submit's.
func TestCaptureHandMadeTar(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	gitCmd(t, src, "init", "-q", "-b", "main")
	write(t, src, "a.txt", "one\n")
	gitCmd(t, src, "add", "-A")
	gitCmd(t, src, "commit", "-qm", "one")
	gitCmd(t, src, "pack-refs", "--all") // the branch only in packed-refs, as after a clone
	snap := filepath.Join(t.TempDir(), "hand.tar")
	out, err := exec.Command("tar", "-cf", snap, "-C", src, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	ws := t.TempDir()
	sf, err := os.Open(snap)
	require.NoError(t, err)
	require.NoError(t, workspace.Unpack(sf, ws, workspace.UnpackOptions{}))
	sf.Close()
	write(t, ws, "a.txt", "two\n")
	c, err := workspace.Capture(ws, workspace.CaptureOptions{RunID: "hand", Snapshot: snap, Scratch: t.TempDir()})
	require.NoError(t, err)
	require.Equal(t, gitCmd(t, src, "rev-parse", "HEAD"), c.Result.Base)
	require.Equal(t, 1, c.Result.Commits)
	require.Contains(t, string(c.Patch), "-one\n+two\n")
}

// TestSnapshotLooseOrPacked: objects of HEAD's history that the
// repository stores loose, in files of 2 KiB or more, travel as the same
// loose object files, byte for byte; the others (small loose ones, packed
// ones, deltas included) as one pack of whole objects. Above the
// loose-object cap every object is packed, and that pack depends only on
// the objects: the same bytes as the snapshot of the repository after git
// gc. Each snapshot is deterministic and git reads each as the same
// history. Not parallel: it sets the cap.
func TestSnapshotLooseOrPacked(t *testing.T) {
	dir := t.TempDir()
	gitCmd(t, dir, "init", "-q", "-b", "main")
	commit := func(c int) {
		for i := range 60 {
			text := strings.Repeat(fmt.Sprintf("line %d of file %d\n", c, i), 50+i) // small once compressed
			if i%3 == 0 {
				text = randomText(t, 5000+100*i) // about 2.8 KiB or more once compressed
			}
			write(t, dir, fmt.Sprintf("d%d/f%d.txt", i%4, i), text)
		}
		gitCmd(t, dir, "add", "-A")
		gitCmd(t, dir, "commit", "-qm", fmt.Sprintf("commit %d", c))
	}
	for c := range 3 {
		commit(c)
	}
	snap := func() (workspace.Info, map[string]string, []byte) {
		var b bytes.Buffer
		info, err := workspace.Snapshot(dir, &b, workspace.SnapshotOptions{})
		require.NoError(t, err)
		var again bytes.Buffer
		_, err = workspace.Snapshot(dir, &again, workspace.SnapshotOptions{})
		require.NoError(t, err)
		require.Equal(t, b.Bytes(), again.Bytes(), "deterministic")
		return info, tarNames(t, b.Bytes()), b.Bytes()
	}
	// bigLoose lists the objects reachable from revs stored in loose
	// files of 2 KiB or more.
	bigLoose := func(revs ...string) map[string]string {
		out := map[string]string{}
		for _, o := range strings.Fields(gitCmd(t, dir, append([]string{"rev-list", "--objects", "--no-object-names"}, revs...)...)) {
			disk, err := os.ReadFile(filepath.Join(dir, ".git", "objects", o[:2], o[2:]))
			if err == nil && len(disk) >= 2048 {
				out[".git/objects/"+o[:2]+"/"+o[2:]] = string(disk)
			}
		}
		return out
	}
	il, lnames, loose := snap()
	big := bigLoose("HEAD")
	require.Equal(t, 3*20, len(big), "the random files' blobs")
	lfiles := looseNames(lnames)
	require.Len(t, lfiles, len(big))
	for _, n := range lfiles {
		require.Equal(t, big[n], lnames[n], "%s: the file as it is", n)
	}
	require.Len(t, packNames(lnames), 2, "the other objects in one pack and its index")

	restore := workspace.SetMaxLooseObjects(len(big) - 1)
	ic, _, capped := snap()
	restore()
	gitCmd(t, dir, "gc", "-q", "--aggressive")
	require.True(t, strings.HasPrefix(gitCmd(t, dir, "count-objects"), "0 objects"), "every object packed")
	ip, pnames, packed := snap()
	require.Equal(t, ic, ip)
	require.Equal(t, capped, packed, "over the cap, the pack of loose objects is the pack of packed ones")
	require.Len(t, packNames(pnames), 2, "one pack and its index")
	require.Empty(t, looseNames(pnames))
	require.Equal(t, il.Commits, ip.Commits)
	require.Equal(t, 3, il.Commits)

	commit(3)
	im, mnames, mixed := snap()
	require.Equal(t, 4, im.Commits)
	require.Len(t, packNames(mnames), 2)
	require.Len(t, looseNames(mnames), 20, "the new commit's random blobs are loose files beside the pack")
	for n, disk := range bigLoose("HEAD", "^HEAD~1") {
		require.Equal(t, disk, mnames[n])
	}

	for _, snapshot := range [][]byte{loose, packed, mixed} {
		out := t.TempDir()
		require.NoError(t, workspace.Unpack(bytes.NewReader(snapshot), out, workspace.UnpackOptions{}))
		require.Contains(t, gitCmd(t, out, "log", "--format=%s"), "commit 2\ncommit 1\ncommit 0")
		require.Empty(t, gitCmd(t, out, "status", "--porcelain"))
		gitCmd(t, out, "fsck", "--strict", "--full")
	}
}

// randomText returns n bytes of hex of random bytes (about half as large
// once compressed).
func randomText(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, (n+1)/2)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)[:n]
}

// looseNames returns the names of a snapshot's loose object files.
func looseNames(names map[string]string) []string {
	var out []string
	for n := range names {
		if len(n) == len(".git/objects/xx/")+38 && strings.HasPrefix(n, ".git/objects/") && !strings.HasPrefix(n, ".git/objects/pack/") {
			out = append(out, n)
		}
	}
	return out
}

// packNames returns the names of a snapshot's pack files.
func packNames(names map[string]string) []string {
	var out []string
	for n := range names {
		if strings.HasPrefix(n, ".git/objects/pack/") && !strings.HasSuffix(n, "/") {
			out = append(out, n)
		}
	}
	return out
}

// TestSnapshotLinkedWorkTree: a work tree made by git worktree add keeps
// its objects in the main repository's directory; its loose objects travel
// as files too, and git reads the snapshot.
func TestSnapshotLinkedWorkTree(t *testing.T) {
	t.Parallel()
	dir := testRepo(t)
	linked := filepath.Join(t.TempDir(), "linked")
	gitCmd(t, dir, "worktree", "add", "-q", "-b", "other", linked)
	write(t, linked, "big.txt", randomText(t, 8192))
	gitCmd(t, linked, "add", "big.txt")
	gitCmd(t, linked, "commit", "-qm", "big")
	var b bytes.Buffer
	info, err := workspace.Snapshot(linked, &b, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.Equal(t, 3, info.Commits)
	blob := gitCmd(t, linked, "rev-parse", "HEAD:big.txt")
	names := tarNames(t, b.Bytes())
	require.Contains(t, names, ".git/objects/"+blob[:2]+"/"+blob[2:])
	require.Equal(t, "ref: refs/heads/other\n", names[".git/HEAD"])
	out := t.TempDir()
	require.NoError(t, workspace.Unpack(bytes.NewReader(b.Bytes()), out, workspace.UnpackOptions{}))
	require.Equal(t, "big\nsecond\nfirst", gitCmd(t, out, "log", "--format=%s"))
	gitCmd(t, out, "fsck", "--strict", "--full")
}
