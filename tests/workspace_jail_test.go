package tests

import (
	"archive/tar"
	"bytes"
	"compress/zlib"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/workspace"
)

// putSnapshot stores the tar at file in the workspace bucket under its
// digest's name, as any NATS client may, and returns the request field.
func putSnapshot(t *testing.T, url, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	name := messages.WorkspaceObjectName(digest)
	r := run(t, url, natsBin, "object", "put", messages.BucketWorkspaces, file, "--name", name, "--no-progress", "-f")
	require.Equal(t, 0, r.code, r.stderr)
	return `{"name":"` + name + `","digest":"` + digest + `"}`
}

// handTar writes a tar of hdrs to a temporary file and returns its path;
// a regular file's data is Size bytes of 'x'.
func handTar(t *testing.T, hdrs []tar.Header) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "snap.tar")
	f, err := os.Create(file)
	require.NoError(t, err)
	tw := tar.NewWriter(f)
	for _, h := range hdrs {
		require.NoError(t, tw.WriteHeader(&h))
		if h.Typeflag == tar.TypeReg && h.Size > 0 {
			_, err := tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			require.NoError(t, err)
		}
	}
	require.NoError(t, tw.Close())
	require.NoError(t, f.Close())
	return file
}

// dirUnchanged returns a check that dir still holds exactly what it held.
func dirUnchanged(t *testing.T, dir string) func() {
	t.Helper()
	snap := func() string {
		var b strings.Builder
		require.NoError(t, filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, "%s %v %d\n", p, fi.Mode(), fi.Size())
			return nil
		}))
		return b.String()
	}
	before := snap()
	return func() { require.Equal(t, before, snap(), "%s was not touched", dir) }
}

// TestWorkspaceHostileSnapshotRefused: snapshots no `jetcrew submit` makes,
// put in the bucket by hand — `..` and absolute names, a hard link to
// /etc/shadow, a device, a FIFO, a file through a symlink to a host
// directory, a sparse tar bomb — are refused by the worker's header scan
// or, first, by the in-jail unpack (the snapshot streams in beside the
// run container's start, and both apply the same rules) before the agent
// runs: failed with the reason, a dead letter, the agent never run (no
// exit code, or the in-jail exec's), nothing written outside.
func TestWorkspaceHostileSnapshotRefused(t *testing.T) {
	needsDocker(t)
	url := up(t, "--workspace-max-bytes", "10000000")
	// The bucket exists once a first snapshot went through submit.
	small := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(small, "a.txt"), []byte("a\n"), 0o644))
	r := run(t, url, jetcrewBin, "submit", "--wait", "--workspace", small, "true")
	require.Equal(t, 0, r.code, r.stderr)

	outside := t.TempDir()
	unchanged := dirUnchanged(t, outside)
	bomb := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bomb, "zeros"), nil, 0o644))
	cases := map[string]struct {
		hdrs []tar.Header
		want string
	}{
		"dotdot":   {[]tar.Header{{Name: "../escape", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}}, "not a relative path inside the tree"},
		"absolute": {[]tar.Header{{Name: outside + "/abs", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}}, "not a relative path inside the tree"},
		"hardlink": {[]tar.Header{{Name: "shadow", Typeflag: tar.TypeLink, Linkname: "/etc/shadow"}}, "is not allowed"},
		"device":   {[]tar.Header{{Name: "mem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1, Mode: 0o666}}, "is not allowed"},
		"fifo":     {[]tar.Header{{Name: "fifo", Typeflag: tar.TypeFifo, Mode: 0o666}}, "is not allowed"},
		"through symlink": {[]tar.Header{{Name: "out", Typeflag: tar.TypeSymlink, Linkname: outside},
			{Name: "out/pwned", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}}, "is not a directory|path escapes from parent"},
	}
	ids := map[string]string{}
	for name, c := range cases {
		id := "hostile-" + strings.ReplaceAll(name, " ", "-")
		ids[id] = c.want
		ref := putSnapshot(t, url, handTar(t, c.hdrs))
		r := run(t, url, natsBin, "pub", "--jetstream", "jetcrew.runs.default",
			`{"id":"`+id+`","profile":"shell","prompt":"echo ran","workspace":`+ref+`}`)
		require.Equal(t, 0, r.code, r.stderr)
	}
	// A tar bomb: a sparse file of 10 GiB in a few KiB of tar.
	require.NoError(t, os.Truncate(filepath.Join(bomb, "zeros"), 10<<30))
	bombTar := filepath.Join(t.TempDir(), "bomb.tar")
	out, err := exec.Command("tar", "--sparse", "--format=posix", "-cf", bombTar, "-C", bomb, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	ids["hostile-bomb"] = "exceed 10000000 bytes"
	ref := putSnapshot(t, url, bombTar)
	r = run(t, url, natsBin, "pub", "--jetstream", "jetcrew.runs.default",
		`{"id":"hostile-bomb","profile":"shell","prompt":"echo ran","workspace":`+ref+`}`)
	require.Equal(t, 0, r.code, r.stderr)

	for id, want := range ids {
		st := waitFinal(t, url, id)
		require.Equal(t, messages.StateFailed, st.State, id)
		require.Regexp(t, want, st.Reason, id) // the scan's words, or the in-jail unpack's (os.Root)
		if st.ExitCode != nil {
			require.Equal(t, workspace.JailExitCode, *st.ExitCode, "%s: only the in-jail exec ran, never the agent", id)
		}
		dl := run(t, url, natsBin, "stream", "get", messages.StreamFailed, "-S", messages.SubjectFailed("default", id))
		require.Equal(t, 0, dl.code, "%s has a dead letter: %s", id, dl.stderr)
	}
	unchanged()
}

// hostileConfig is a .git/config whose every program would touch marker:
// an fsmonitor, a hooks path, filter and diff drivers, an alias.
func hostileConfig(marker string) string {
	touch := "sh -c 'touch " + marker + "'"
	return "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tfsmonitor = " + touch + "\n\thooksPath = hooks\n" +
		"[filter \"x\"]\n\tclean = " + touch + "\n\tsmudge = " + touch + "\n[diff \"x\"]\n\ttextconv = " + touch + "\n" +
		"[alias]\n\tst = !" + touch + "\n"
}

// TestWorkspaceHostileContent: a snapshot that passes the scan but carries
// everything a hostile submitter could plant — a .git/config with
// fsmonitor, hooks, filter and diff drivers and an alias, hooks, symlinks
// to /etc/shadow, to the worker's data directory and to another run's
// workspace, a setuid file, absurd names — runs, and the run then plants
// more (artifact symlinks to host files, writes through the links). It
// ends as the run ended, with a result that holds none of the host's
// bytes; no marker appears on the host and nothing outside is touched.
func TestWorkspaceHostileContent(t *testing.T) {
	needsDocker(t)
	data := t.TempDir()
	url := up(t, "--data", data)
	marker := filepath.Join(t.TempDir(), "pwned")
	other := t.TempDir() // stands for another run's workspace
	secret := filepath.Join(other, "secret.txt")
	require.NoError(t, os.WriteFile(secret, []byte("HOST-SECRET-4711\n"), 0o644))
	otherUnchanged := dirUnchanged(t, other)

	repo := t.TempDir()
	git(t, repo, "init", "-q", "-b", "main")
	require.NoError(t, os.WriteFile(filepath.Join(repo, "a.txt"), []byte("one\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(repo, ".gitattributes"), []byte("* filter=x diff=x\n"), 0o644))
	git(t, repo, "add", "-A")
	git(t, repo, "commit", "-qm", "one")
	require.NoError(t, os.WriteFile(filepath.Join(repo, ".git", "config"), []byte(hostileConfig(marker)), 0o644))
	evil := []byte("#!/bin/sh\ntouch " + marker + "\n")
	for _, h := range []string{".git/hooks/post-checkout", ".git/hooks/pre-commit", "hooks/post-commit", "evil.sh"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(repo, h)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(repo, h), evil, 0o755))
	}
	require.NoError(t, os.Chmod(filepath.Join(repo, "evil.sh"), 0o4755|os.ModeSetuid))
	for name, target := range map[string]string{"shadow": "/etc/shadow", "data": data, "other": other, "secret": secret} {
		require.NoError(t, os.Symlink(target, filepath.Join(repo, name)))
	}
	for _, name := range []string{"-rf", "new\nline", strings.Repeat("n", 250), "ünï cödé", " "} {
		require.NoError(t, os.WriteFile(filepath.Join(repo, name), []byte("absurd\n"), 0o644))
	}
	snap := filepath.Join(t.TempDir(), "snap.tar")
	out, err := exec.Command("tar", "-cf", snap, "-C", repo, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	hdr, err := exec.Command("tar", "-tvf", snap, "./evil.sh").CombinedOutput()
	require.NoError(t, err, "%s", hdr)
	require.Contains(t, string(hdr), "rws", "the snapshot asks for setuid")
	ref := putSnapshot(t, url, snap)

	script := `stat -c 'mode %a' evil.sh; ls -d -- -rf; cat secret other/secret.txt 2>&1; echo pwned > other/pwned 2>&1
echo two > a.txt; mkdir -p .jetcrew/artifacts; echo ok > .jetcrew/artifacts/ok.txt
ln -s ` + secret + ` .jetcrew/artifacts/leak; ln -s /etc/passwd .jetcrew/artifacts/passwd; ./evil.sh; true`
	body := fmt.Sprintf(`{"id":"hostile-content","profile":"shell","prompt":%q,"workspace":%s}`, script, ref)
	r := run(t, url, natsBin, "pub", "--jetstream", "jetcrew.runs.default", body)
	require.Equal(t, 0, r.code, r.stderr)
	st := waitFinal(t, url, "hostile-content")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	w := run(t, url, jetcrewBin, "watch", "hostile-content")
	require.Contains(t, w.stdout, "mode 755", "no setuid bit survives the unpack: %s", w.stdout)
	require.Contains(t, w.stdout, "-rf")
	require.NotContains(t, w.stdout, "HOST-SECRET", "a symlink in the snapshot reaches nothing of the host")

	wr := st.WorkspaceResult
	require.NotNil(t, wr)
	// The one name a result cannot hold is left out and listed; the rest
	// is captured.
	require.Equal(t, []string{"new\nline"}, wr.Refused)
	require.Equal(t, "1 path left out: their names hold a control character, or a component git will not check out (see refused)", wr.Error)
	require.Equal(t, 1, wr.FilesChanged, "a.txt")
	require.Len(t, wr.Artifacts, 1, "artifact symlinks are skipped")
	require.Equal(t, "ok.txt", wr.Artifacts[0].Name)
	d := run(t, url, jetcrewBin, "diff", "hostile-content")
	require.Equal(t, 0, d.code, d.stderr)
	require.Contains(t, d.stdout, "-one\n+two\n")
	ar := run(t, url, jetcrewBin, "artifacts", "hostile-content")
	require.Equal(t, 0, ar.code, ar.stderr)
	require.NotContains(t, ar.stdout+d.stdout, "HOST-SECRET")

	require.NoFileExists(t, marker, "nothing the repository names ran on the host")
	otherUnchanged()
}

// TestWorkspaceUnpackNoSpace: a snapshot larger than the profile's
// workspace_mib fails while unpacking inside the run's container (ENOSPC
// on the tree's tmpfs): the run fails with that reason and a dead letter,
// no retry, the agent's command never ran and nothing is captured.
func TestWorkspaceUnpackNoSpace(t *testing.T) {
	needsDocker(t)
	profiles := filepath.Join(t.TempDir(), "profiles.toml")
	require.NoError(t, os.WriteFile(profiles, []byte("[profiles.small]\nimage = \"jetcrew-sandbox:latest\"\ncommand = [\"/bin/sh\", \"-c\", \"{prompt}\"]\nrequire_bridge = false\nworkspace_mib = 1\nretries = 2\n"), 0o644))
	url := up(t, "--profiles", profiles)
	big := t.TempDir()
	blob := make([]byte, 3<<20)
	_, _ = rand.Read(blob)
	require.NoError(t, os.WriteFile(filepath.Join(big, "blob.bin"), blob, 0o644))
	r := run(t, url, jetcrewBin, "submit", "--id", "ws-nospace", "--profile", "small", "--wait", "--workspace", big, "echo agent-ran")
	require.NotEqual(t, 0, r.code)
	require.NotContains(t, r.stdout, "agent-ran")
	st := status(t, url, "ws-nospace")
	require.Equal(t, messages.StateFailed, st.State)
	require.Contains(t, st.Reason, "the snapshot does not fit the profile's workspace_mib (1 MiB)")
	require.Equal(t, 1, st.Attempts, "never retried")
	require.Nil(t, st.WorkspaceResult, "nothing to capture")
	dl := run(t, url, natsBin, "stream", "get", messages.StreamFailed, "-S", messages.SubjectFailed("default", "ws-nospace"))
	require.Equal(t, 0, dl.code, "a dead letter: %s", dl.stderr)
}

// looseObject returns the id and file bytes of a loose git object of type
// typ whose header claims size bytes and whose body is body followed by
// zeros up to size.
func looseObject(t *testing.T, typ string, body []byte, size int) (string, []byte) {
	t.Helper()
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	h := sha1.New()
	w := io.MultiWriter(zw, h)
	fmt.Fprintf(w, "%s %d\x00", typ, size)
	_, err := w.Write(body)
	require.NoError(t, err)
	zero := make([]byte, 1<<20)
	for left := size - len(body); left > 0; left -= len(zero) {
		_, err := w.Write(zero[:min(left, len(zero))])
		require.NoError(t, err)
	}
	require.NoError(t, zw.Close())
	return hex.EncodeToString(h.Sum(nil)), z.Bytes()
}

// TestWorkspaceRunWritesHostileGit: a run rewrites its own .git — a config
// with an fsmonitor and hooks that would touch a marker, and a branch
// pointing at a commit whose blob inflates to 1 GiB (a pack bomb, as a
// loose object). The capture reads it inside the capture container, whose
// memory limit bounds it; the worker survives: the run ends with its own
// outcome, its result says what went wrong, no marker appears and the next
// run succeeds.
func TestWorkspaceRunWritesHostileGit(t *testing.T) {
	needsDocker(t)
	url := up(t)
	marker := filepath.Join(t.TempDir(), "pwned")
	repo := t.TempDir()
	git(t, repo, "init", "-q", "-b", "main")
	require.NoError(t, os.WriteFile(filepath.Join(repo, "a.txt"), []byte("one\n"), 0o644))
	git(t, repo, "add", "-A")
	git(t, repo, "commit", "-qm", "one")
	base := git(t, repo, "rev-parse", "HEAD")

	blob, blobData := looseObject(t, "blob", nil, 1<<30)
	rawBlob, _ := hex.DecodeString(blob)
	tree, treeData := looseObject(t, "tree", append([]byte("100644 big\x00"), rawBlob...), 11+20)
	cbody := "tree " + tree + "\nparent " + base + "\nauthor a <a@x> 1700000000 +0000\ncommitter a <a@x> 1700000000 +0000\n\nbomb\n"
	commit, commitData := looseObject(t, "commit", []byte(cbody), len(cbody))
	for id, data := range map[string][]byte{blob: blobData, tree: treeData, commit: commitData} {
		p := filepath.Join(repo, "payload", "objects", id[:2], id[2:])
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, data, 0o644))
	}
	script := fmt.Sprintf("set -e; cp -r payload/objects/. .git/objects/; echo %s > .git/refs/heads/main\n"+
		"cat >> .git/config <<'EOF'\n%sEOF\n"+
		"mkdir -p .git/hooks; for h in post-commit pre-commit post-checkout fsmonitor-watchman; do printf '#!/bin/sh\\ntouch %s\\n' > .git/hooks/$h; chmod +x .git/hooks/$h; done\n"+
		"echo two > a.txt", commit, hostileConfig(marker), marker)
	r := run(t, url, jetcrewBin, "submit", "--id", "ws-bomb", "--wait", "--workspace", repo, script)
	require.Equal(t, 0, r.code, "stdout=%s stderr=%s", r.stdout, r.stderr)
	st := status(t, url, "ws-bomb")
	require.Equal(t, messages.StateSucceeded, st.State, "the run's own outcome")
	require.NotNil(t, st.WorkspaceResult)
	require.NotEmpty(t, st.WorkspaceResult.Error, "the result says the run's repository could not be captured")
	t.Logf("result error: %s", st.WorkspaceResult.Error)
	require.NoFileExists(t, marker)

	r = run(t, url, jetcrewBin, "submit", "--id", "ws-after", "--wait", "--workspace", repo, "echo three > a.txt")
	require.Equal(t, 0, r.code, r.stderr)
	after := status(t, url, "ws-after")
	require.NotNil(t, after.WorkspaceResult)
	require.Empty(t, after.WorkspaceResult.Error)
	require.Equal(t, 1, after.WorkspaceResult.FilesChanged)
}
