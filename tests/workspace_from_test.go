package tests

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"hash/adler32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// TestWorkspaceFrom is issue 28's "start from a result" on real parts: a
// run edits a file and adds one (the sandbox has no git: both arrive as the
// commit jetcrew makes of what a run leaves uncommitted); a run --from it
// sees both, on the earlier run's head, with nothing uploaded; a third run
// from the second, and `jetcrew apply` of the last gives one branch with
// the three runs' commits on the submitted HEAD. A second --from of the
// same run reuses the snapshot built for the first. A run --from a run
// that does not exist, or one with no workspace, is refused.
func TestWorkspaceFrom(t *testing.T) {
	needsDocker(t)
	for _, mode := range authModes {
		t.Run(mode.name, func(t *testing.T) { testWorkspaceFrom(t, mode.args) })
	}
}

func testWorkspaceFrom(t *testing.T, upArgs []string) {
	url := up(t, slices.Clone(upArgs)...)
	repo := t.TempDir()
	git(t, repo, "init", "-q", "-b", "main")
	require.NoError(t, os.WriteFile(filepath.Join(repo, "main.go"), []byte("package main\n\nfunc main() { println(\"foo\") }\n"), 0o644))
	git(t, repo, "add", "-A")
	git(t, repo, "commit", "-qm", "start")
	base := git(t, repo, "rev-parse", "HEAD")

	r := run(t, url, jetcrewBin, "submit", "--id", "from-1", "--wait", "--workspace", repo, "sed -i s/foo/bar/ main.go; echo one > one.txt")
	require.Equal(t, 0, r.code, "stdout=%s stderr=%s", r.stdout, r.stderr)
	st1 := status(t, url, "from-1")
	require.NotNil(t, st1.WorkspaceResult)
	require.NotEmpty(t, st1.WorkspaceResult.Snapshot)

	r = run(t, url, jetcrewBin, "submit", "--id", "from-2", "--wait", "--from", "from-1",
		"cat main.go one.txt; cat .git/HEAD .git/refs/heads/main; echo two >> one.txt")
	require.Equal(t, 0, r.code, "stdout=%s stderr=%s", r.stdout, r.stderr)
	require.NotContains(t, r.stderr, "uploaded", "nothing is uploaded")
	require.Equal(t, "package main\n\nfunc main() { println(\"bar\") }\none\nref: refs/heads/main\n"+st1.WorkspaceResult.Head+"\n", r.stdout,
		"the earlier run's edit and its new file, on its head")
	st2 := status(t, url, "from-2")
	require.Equal(t, messages.StateSucceeded, st2.State)
	require.NotNil(t, st2.WorkspaceFrom)
	require.Equal(t, "from-1", st2.WorkspaceFrom.Run)
	require.Equal(t, st1.WorkspaceResult.Head, st2.WorkspaceResult.Base)
	require.Equal(t, 1, st2.WorkspaceResult.FilesChanged, "the diff is the second run's own")
	res := run(t, url, jetcrewBin, "result", "from-2")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "run from-1")

	r = run(t, url, jetcrewBin, "submit", "--id", "from-3", "--wait", "--from", "from-2", "cat one.txt; echo three > three.txt")
	require.Equal(t, 0, r.code, "stdout=%s stderr=%s", r.stdout, r.stderr)
	require.Equal(t, "one\ntwo\n", r.stdout)

	// apply of the last: one branch, three commits, one per run, in order.
	before := git(t, repo, "status", "--porcelain", "--ignored")
	a := exec.Command(jetcrewBin, "apply", "from-3")
	a.Dir, a.Env = repo, append(append(os.Environ(), "NATS_URL="+url), authEnv(url, "submitter")...)
	out, err := a.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "branch jetcrew/from-3")
	require.Equal(t, "jetcrew: changes run from-3 left uncommitted\njetcrew: changes run from-2 left uncommitted\njetcrew: changes run from-1 left uncommitted\nstart",
		git(t, repo, "log", "--format=%s", "jetcrew/from-3"))
	require.Equal(t, "3", git(t, repo, "rev-list", "--count", base+"..jetcrew/from-3"))
	require.Equal(t, "jetcrew/from-3\nmain", git(t, repo, "branch", "--format=%(refname:short)"))
	require.Equal(t, before, git(t, repo, "status", "--porcelain", "--ignored"))
	require.Equal(t, "one\ntwo", git(t, repo, "show", "jetcrew/from-3:one.txt"))
	require.Equal(t, "three", git(t, repo, "show", "jetcrew/from-3:three.txt"))
	git(t, repo, "fsck", "--strict")

	// From from-1 again: the same snapshot, built once.
	r = run(t, url, jetcrewBin, "submit", "--id", "from-2b", "--wait", "--from", "from-1", "cat one.txt")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, *st2.WorkspaceFrom, *status(t, url, "from-2b").WorkspaceFrom)
	ls := run(t, url, natsBin, "object", "ls", messages.BucketWorkspaces, "--names")
	require.Equal(t, 0, ls.code, ls.stderr)
	var caches int
	for _, n := range strings.Fields(ls.stdout) {
		if strings.HasPrefix(n, "from/") {
			caches++
		}
	}
	require.Equal(t, 2, caches, "one built snapshot per result built from (from-1's, from-2's): %s", ls.stdout)

	// Refused: submit checks first; the worker refuses what it publishes.
	r = run(t, url, jetcrewBin, "submit", "--wait", "--from", "nope", "true")
	require.NotEqual(t, 0, r.code)
	require.Contains(t, r.stderr, "nope")
	r = run(t, url, jetcrewBin, "submit", "--id", "plain", "--wait", "true")
	require.Equal(t, 0, r.code, r.stderr)
	r = run(t, url, jetcrewBin, "submit", "--wait", "--from", "plain", "true")
	require.NotEqual(t, 0, r.code)
	require.Contains(t, r.stderr, "no workspace result")
}

// fromInflationBytes is the file of zeros the hostile run of
// TestWorkspaceFromInflation leaves: 200 MiB, a few hundred KiB packed.
const fromInflationBytes = 200 << 20

// TestWorkspaceFromInflation is issue 36's "a result inflates the worker":
// a run leaves 200 MiB of zeros, which its capture packs into a bundle of a
// few hundred KiB; a run --from it must not make the `jetcrew up` process
// (its worker) grow by more than 64 MiB above idle (its peak resident set,
// VmHWM, reset just before), and it either sees the file whole or fails
// with the reason named.
func TestWorkspaceFromInflation(t *testing.T) {
	needsDocker(t)
	// The capture of 200 MiB of zeros needs more than the default memory
	// (it is bounded by the capture container's, not the worker's).
	profiles := filepath.Join(t.TempDir(), "profiles.toml")
	require.NoError(t, os.WriteFile(profiles, []byte("[profiles.shell]\nimage = \"jetcrew-sandbox:latest\"\n"+
		"command = [\"/bin/sh\", \"-c\", \"{prompt}\"]\nrequire_bridge = false\nmemory_mib = 1536\n"), 0o644))
	url, logs, pid := upProcess(t, "--profiles", profiles)
	repo := t.TempDir()
	git(t, repo, "init", "-q", "-b", "main")
	require.NoError(t, os.WriteFile(filepath.Join(repo, "README"), []byte("small\n"), 0o644))
	git(t, repo, "add", "-A")
	git(t, repo, "commit", "-qm", "start")

	script, _ := handCommitZeros(t, git(t, repo, "rev-parse", "HEAD"), git(t, repo, "rev-parse", "HEAD:README"))
	r := run(t, url, jetcrewBin, "submit", "--id", "inflate-1", "--wait", "--workspace", repo, script)
	require.Equal(t, 0, r.code, "stdout=%s stderr=%s", r.stdout, r.stderr)
	st1 := status(t, url, "inflate-1")
	require.NotNil(t, st1.WorkspaceResult)
	// Two commits: the run's by hand, then the one the capture makes of
	// the work tree, which never held zeros.bin (its deletion).
	require.Equal(t, 2, st1.WorkspaceResult.Commits, "%+v\n%s", *st1.WorkspaceResult, logs.String())
	for _, o := range st1.WorkspaceResult.Objects {
		t.Logf("result object %s: %d bytes", o.Name, o.Size)
	}

	idle := procStatusKiB(t, pid, "VmRSS")
	require.NoError(t, os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0), "reset the peak resident set")
	r = run(t, url, jetcrewBin, "submit", "--id", "inflate-2", "--wait", "--from", "inflate-1", "ls")
	peak := procStatusKiB(t, pid, "VmHWM")
	st2 := status(t, url, "inflate-2")
	t.Logf("jetcrew up: idle %d KiB, peak %d KiB during the run --from (+%d KiB); run %s: %s", idle, peak, peak-idle, st2.State, st2.Reason)
	require.LessOrEqual(t, peak-idle, int64(64<<10), "the worker's peak above idle, KiB\n%s", logs.String())
	if r.code == 0 {
		require.Equal(t, "README\n", r.stdout, "the tree at the earlier run's head")
	} else {
		require.Equal(t, messages.StateFailed, st2.State, st2.Reason)
		require.Contains(t, st2.Reason, "out of proportion", "the refusal names its reason")
	}
}

// procStatusKiB returns field (VmRSS, VmHWM) of /proc/<pid>/status, in KiB.
func procStatusKiB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err, line)
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// handCommitZeros returns a shell script that commits, by hand (the
// sandbox has no git), fromInflationBytes of zeros as zeros.bin beside the
// README blob readme, on parent, and moves main to that commit; and the
// commit's id. The blob is written as a loose object without the file ever
// existing: gzip's deflate stream between zlib's header and the Adler-32
// of the object, which the test computes.
func handCommitZeros(t *testing.T, parent, readme string) (script, commit string) {
	t.Helper()
	header := fmt.Sprintf("blob %d\x00", fromInflationBytes)
	sum, adler := sha1.New(), adler32.New()
	zeros := make([]byte, 1<<20)
	for _, w := range []io.Writer{sum, adler} {
		_, _ = io.WriteString(w, header)
		for range fromInflationBytes / len(zeros) {
			_, _ = w.Write(zeros)
		}
	}
	blob := hex.EncodeToString(sum.Sum(nil))
	var octal strings.Builder
	for _, b := range adler.Sum(nil) {
		fmt.Fprintf(&octal, "\\%03o", b)
	}
	hashBytes := func(h string) string { b, err := hex.DecodeString(h); require.NoError(t, err); return string(b) }
	loose := func(kind, content string) (string, string) {
		raw := fmt.Sprintf("%s %d\x00%s", kind, len(content), content)
		id := sha1.Sum([]byte(raw))
		var z bytes.Buffer
		zw := zlib.NewWriter(&z)
		_, _ = zw.Write([]byte(raw))
		require.NoError(t, zw.Close())
		return hex.EncodeToString(id[:]), base64.StdEncoding.EncodeToString(z.Bytes())
	}
	tree, treeZ := loose("tree", "100644 README\x00"+hashBytes(readme)+"100644 zeros.bin\x00"+hashBytes(blob))
	commit, commitZ := loose("commit", "tree "+tree+"\nparent "+parent+
		"\nauthor a <a@x> 1700000000 +0000\ncommitter a <a@x> 1700000000 +0000\n\nzeros by hand\n")
	var sb strings.Builder
	sb.WriteString("set -e\nobj() { mkdir -p .git/objects/${1%${1#??}}; cat > .git/objects/${1%${1#??}}/${1#??}; }\n")
	fmt.Fprintf(&sb, "{ printf '\\170\\001'; { printf 'blob %d\\000'; head -c %d /dev/zero; } | gzip -1 -c | tail -c +11 | head -c -8; printf '%s'; } | obj %s\n",
		fromInflationBytes, fromInflationBytes, octal.String(), blob)
	fmt.Fprintf(&sb, "echo %s | base64 -d | obj %s\necho %s | base64 -d | obj %s\necho %s > .git/refs/heads/main\n", treeZ, tree, commitZ, commit, commit)
	return sb.String(), commit
}
