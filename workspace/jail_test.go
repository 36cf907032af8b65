package workspace_test

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/workspace"
)

// tarOf returns a tar of hdrs, each regular file holding Size bytes 'x'.
func tarOf(t *testing.T, hdrs ...tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hdrs {
		require.NoError(t, tw.WriteHeader(&h))
		if h.Typeflag == tar.TypeReg {
			_, err := tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			require.NoError(t, err)
		}
	}
	require.NoError(t, tw.Close())
	return b.Bytes()
}

// TestScanRefusesWhatUnpackRefuses: the worker's header scan refuses every
// hostile archive Unpack refuses, and the caps, without writing anything;
// it accepts what Unpack accepts.
func TestScanRefusesWhatUnpackRefuses(t *testing.T) {
	t.Parallel()
	reg := func(name string, size int64) tar.Header {
		return tar.Header{Name: name, Typeflag: tar.TypeReg, Size: size, Mode: 0o4755}
	}
	for name, c := range map[string]struct {
		hdrs []tar.Header
		want error
	}{
		"dotdot":        {[]tar.Header{reg("../x", 1)}, workspace.ErrBadArchive},
		"absolute":      {[]tar.Header{reg("/tmp/x", 1)}, workspace.ErrBadArchive},
		"hardlink":      {[]tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/shadow"}}, workspace.ErrBadArchive},
		"device":        {[]tar.Header{{Name: "d", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}}, workspace.ErrBadArchive},
		"fifo":          {[]tar.Header{{Name: "f", Typeflag: tar.TypeFifo}}, workspace.ErrBadArchive},
		"through link":  {[]tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}, reg("l/pwned", 1)}, workspace.ErrBadArchive},
		"duplicate":     {[]tar.Header{reg("a", 1), reg("a", 1)}, workspace.ErrBadArchive},
		"file over dir": {[]tar.Header{reg("a", 1), reg("a/b", 1)}, workspace.ErrBadArchive},
		"dir over file": {[]tar.Header{reg("a/b", 1), reg("a", 1)}, workspace.ErrBadArchive},
		"too many":      {[]tar.Header{reg("a", 1), reg("b", 1), reg("c", 1)}, workspace.ErrTooLarge},
		"too big":       {[]tar.Header{reg("a", 60), reg("b", 60)}, workspace.ErrTooLarge},
	} {
		b := tarOf(t, c.hdrs...)
		o := workspace.UnpackOptions{MaxBytes: 100, MaxFiles: 2}
		require.ErrorIs(t, workspace.Scan(bytes.NewReader(b), o), c.want, name)
		require.ErrorIs(t, workspace.Unpack(bytes.NewReader(b), t.TempDir(), o), c.want, name)
	}
	ok := tarOf(t, tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755}, reg("d/a", 3),
		tar.Header{Name: "d", Typeflag: tar.TypeDir, Mode: 0o755}, tar.Header{Name: "s", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"})
	require.NoError(t, workspace.Scan(bytes.NewReader(ok), workspace.UnpackOptions{MaxBytes: 100, MaxFiles: 10}))
	require.NoError(t, workspace.Unpack(bytes.NewReader(ok), t.TempDir(), workspace.UnpackOptions{MaxBytes: 100, MaxFiles: 10}))
}

// TestJailArgs: the argument list the worker builds parses back to the
// same arguments; bad lists are refused.
func TestJailArgs(t *testing.T) {
	t.Parallel()
	for _, a := range []workspace.JailArgs{
		{Command: "exec", Snapshot: "/s.tar", Dir: "/workspace", MaxBytes: 5, MaxFiles: 6, Argv: []string{"/bin/sh", "-c", "--max-bytes 1"}},
		{Command: "exec", Snapshot: "/s.tar", Dir: "/workspace", MaxBytes: 5, MaxFiles: 6, Held: "/gate/held", Argv: []string{"true"}},
		{Command: "exec", Snapshot: "/s.tar", Dir: "/workspace", Session: "/home/agent/.claude/projects", SessionIn: "/run/s.tar", SessionNames: workspace.SessionNames{Keep: []string{"sessions", "state_*.sqlite"}, Skip: []string{"auth.json", "log"}}, Argv: []string{"true"}},
		{Command: "capture", Snapshot: "/s.tar", Dir: "/workspace", Scratch: "/scratch", RunID: "r1", MaxBytes: 5, MaxFiles: 6},
	} {
		got, err := workspace.ParseJailArgs(a.ArgList()[1:])
		require.NoError(t, err)
		if a.Argv == nil {
			got.Argv = nil
		}
		require.Equal(t, a, got)
	}
	for _, bad := range [][]string{nil, {"rm"}, {"exec", "--snapshot", "s"}, {"exec", "--", "x"}, {"capture", "--snapshot", "s"}, {"exec", "--bogus", "1", "--snapshot", "s", "--", "x"},
		{"exec", "--snapshot", "s", "--session-in", "/s.tar", "--", "x"}, {"exec", "--snapshot", "s", "--session", "rel", "--", "x"},
		{"exec", "--snapshot", "s", "--session", "/h", "--session-skip", "a/b", "--", "x"},
		{"exec", "--snapshot", "s", "--session", "/h", "--session-keep", "[", "--", "x"}} {
		_, err := workspace.ParseJailArgs(bad)
		require.Error(t, err, "%q", bad)
	}
}

// TestJailUnpackAndCapture runs the two in-jail commands as the worker's
// containers do, on a git snapshot: unpack, change, capture to a stream,
// read back.
func TestJailUnpackAndCapture(t *testing.T) {
	t.Parallel()
	src := testRepo(t)
	snap := filepath.Join(t.TempDir(), "snap.tar")
	f, err := os.Create(snap)
	require.NoError(t, err)
	info, err := workspace.Snapshot(src, f, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	ws := t.TempDir()
	require.NoError(t, workspace.JailUnpack(workspace.JailArgs{Command: "exec", Snapshot: snap, Dir: ws}))
	write(t, ws, "sub/a.txt", "changed\n")
	var out, errOut bytes.Buffer
	code := workspace.JailMain([]string{"capture", "--snapshot", snap, "--dir", ws, "--scratch", t.TempDir(), "--run-id", "j1"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	require.Equal(t, fmt.Sprintf("%s%d\n", workspace.CaptureWrittenPrefix, out.Len()), errOut.String(),
		"the stream's length, announced once it is written")
	c, err := workspace.ReadCaptureStream(bytes.NewReader(out.Bytes()), int64(out.Len()), 1<<20)
	require.NoError(t, err)
	require.Equal(t, info.Head, c.Result.Base)
	require.Equal(t, 1, c.Result.FilesChanged)
	patch, ok := c.Object(messages.ResultPatch)
	require.True(t, ok)
	data, err := patch.Bytes()
	require.NoError(t, err)
	require.Contains(t, string(data), "+changed")

	// A failure is one line on stderr and the jail exit code.
	errOut.Reset()
	code = workspace.JailMain([]string{"exec", "--snapshot", filepath.Join(t.TempDir(), "missing.tar"), "--dir", t.TempDir(), "--", "true"}, &out, &errOut)
	require.Equal(t, workspace.JailExitCode, code)
	require.True(t, strings.HasPrefix(errOut.String(), "jetcrew workspace: unpack failed (error): "), errOut.String())

	// With --held, exec touches nothing before the file appears: the
	// unpack (failing here) comes after it.
	errOut.Reset()
	held := filepath.Join(t.TempDir(), "held")
	const after = 300 * time.Millisecond
	timer := time.AfterFunc(after, func() { _ = os.WriteFile(held, nil, 0o444) })
	defer timer.Stop()
	start := time.Now()
	code = workspace.JailMain([]string{"exec", "--held", held, "--snapshot", filepath.Join(t.TempDir(), "missing.tar"), "--dir", t.TempDir(), "--", "true"}, &out, &errOut)
	require.GreaterOrEqual(t, time.Since(start), after, "exec waited for the held file")
	require.Equal(t, workspace.JailExitCode, code)
	require.True(t, strings.HasPrefix(errOut.String(), "jetcrew workspace: unpack failed (error): "), errOut.String())
}

// TestCaptureTreeBeforeGit: a hand-made tar listing the work tree before
// .git (`tar -cf snap.tar a.txt .git`) holds a loose object the work tree
// already stored; the capture takes it as the same object.
func TestCaptureTreeBeforeGit(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	gitCmd(t, src, "init", "-q", "-b", "main")
	write(t, src, "a.txt", "one\n")
	gitCmd(t, src, "add", "-A")
	gitCmd(t, src, "commit", "-qm", "one")
	snap := filepath.Join(t.TempDir(), "snap.tar")
	out, err := exec.Command("tar", "-cf", snap, "-C", src, "a.txt", ".git").CombinedOutput()
	require.NoError(t, err, "%s", out)
	ws := t.TempDir()
	require.NoError(t, workspace.JailUnpack(workspace.JailArgs{Command: "exec", Snapshot: snap, Dir: ws}))
	write(t, ws, "a.txt", "two\n")
	c, err := workspace.Capture(ws, workspace.CaptureOptions{RunID: "tb", Snapshot: snap, Scratch: t.TempDir()})
	require.NoError(t, err)
	require.Equal(t, gitCmd(t, src, "rev-parse", "HEAD"), c.Result.Base)
	require.Contains(t, string(c.Patch), "-one\n+two\n")
}

// TestJailUnpackFollowsStreamedSnapshot: with a gate (a held file), exec's
// unpack reads the snapshot as the worker writes it, and ends only once
// the gate says it is whole and checked, every byte read; a refusal in
// the gate ends it with ErrSnapshotRefused and its kind, whatever it has
// unpacked.
func TestJailUnpackFollowsStreamedSnapshot(t *testing.T) {
	t.Parallel()
	src := testRepo(t)
	var snap bytes.Buffer
	_, err := workspace.Snapshot(src, &snap, workspace.SnapshotOptions{})
	require.NoError(t, err)
	data := snap.Bytes()

	stream := func(t *testing.T, verdict, content string) (error, time.Duration) {
		gate, in := t.TempDir(), t.TempDir()
		path := filepath.Join(in, "snapshot.tar")
		f, err := os.Create(path)
		require.NoError(t, err)
		written := make(chan time.Time, 1)
		go func() {
			// In four parts, 50 ms apart, then the verdict.
			for i := range 4 {
				_, _ = f.Write(data[i*len(data)/4 : (i+1)*len(data)/4])
				time.Sleep(50 * time.Millisecond)
			}
			_ = f.Close()
			written <- time.Now()
			// As the worker does: whole, by a rename.
			_ = os.WriteFile(filepath.Join(gate, ".v"), []byte(content), 0o444)
			_ = os.Rename(filepath.Join(gate, ".v"), filepath.Join(gate, verdict))
		}()
		start := time.Now()
		err = workspace.JailUnpack(workspace.JailArgs{Command: "exec", Snapshot: path, Dir: t.TempDir(), Held: filepath.Join(gate, "held")})
		end := time.Now()
		require.False(t, end.Before(<-written), "it ended after the verdict")
		return err, end.Sub(start)
	}

	err, took := stream(t, workspace.SnapshotCheckedFile, "")
	require.NoError(t, err)
	require.GreaterOrEqual(t, took, 200*time.Millisecond, "it waited for every part")

	err, _ = stream(t, workspace.SnapshotRefusedFile, workspace.UnpackRefused+"\nworkspace snapshot digest mismatch: x")
	require.ErrorIs(t, err, workspace.ErrSnapshotRefused)
	require.Equal(t, workspace.UnpackRefused, workspace.UnpackKind(err))
	require.Contains(t, err.Error(), "digest mismatch")

	err, _ = stream(t, workspace.SnapshotRefusedFile, workspace.UnpackFetch+"\nthe store went away")
	require.ErrorIs(t, err, workspace.ErrSnapshotRefused)
	require.Equal(t, workspace.UnpackFetch, workspace.UnpackKind(err))
}

// A session that does not restore fails the run before the agent starts,
// with a line naming it: never the CLI started with a resume flag for a
// session it cannot find.
func TestJailSessionNotRestored(t *testing.T) {
	t.Parallel()
	snap := filepath.Join(t.TempDir(), "snap.tar")
	f, err := os.Create(snap)
	require.NoError(t, err)
	_, err = workspace.Snapshot(testRepo(t), f, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	bad := filepath.Join(t.TempDir(), "session.tar")
	require.NoError(t, os.WriteFile(bad, []byte("not a tar at all, but long enough to be read as one's header block"), 0o444))
	ran := filepath.Join(t.TempDir(), "ran")
	var out, errOut bytes.Buffer
	code := workspace.JailMain([]string{"exec", "--snapshot", snap, "--dir", t.TempDir(), "--session", filepath.Join(t.TempDir(), "projects"),
		"--session-in", bad, "--", "/bin/sh", "-c", "touch " + ran}, &out, &errOut)
	require.Equal(t, workspace.JailExitCode, code, errOut.String())
	require.Regexp(t, `^jetcrew workspace: unpack failed \(bad-archive\): session not restored: `, errOut.String())
	require.NoFileExists(t, ran, "the agent never started")
}
