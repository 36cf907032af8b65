package tests

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
)

// git runs the git CLI in dir with a fixed identity and no user or system
// config, and returns its trimmed output.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@x", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@x")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "git %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

// TestWorkspaceRun is the user story on real parts: a git work tree
// submitted with --workspace, a run that edits it (sed) and leaves files and
// an artifact, then result, diff (git apply reads it), apply (a branch, the
// current branch and work tree untouched) and artifacts. The sandbox image
// has no git, so the run's changes arrive as the one commit jetcrew makes of
// what a run leaves uncommitted (commits made inside a run are covered by
// the workspace package's tests).
func TestWorkspaceRun(t *testing.T) {
	needsDocker(t)
	for _, mode := range authModes {
		t.Run(mode.name, func(t *testing.T) { testWorkspaceRun(t, mode.args) })
	}
}

// testWorkspaceRun is TestWorkspaceRun on an `up` started with upArgs; with
// --auth, submit, result, diff, apply and artifacts act as the submitter.
func testWorkspaceRun(t *testing.T, upArgs []string) {
	url := up(t, append(slices.Clone(upArgs), "--workspace-max-bytes", "1000000")...)
	repo := t.TempDir()
	git(t, repo, "init", "-q", "-b", "main")
	require.NoError(t, os.WriteFile(filepath.Join(repo, "main.go"), []byte("package main\n\nfunc main() { println(\"foo\") }\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(repo, ".gitignore"), []byte("*.log\n"), 0o644))
	// Random text: its blob's loose file is large enough to travel as it
	// is (docs/workspaces.md), beside the pack of the other objects.
	data := make([]byte, 4096)
	_, _ = rand.Read(data)
	require.NoError(t, os.WriteFile(filepath.Join(repo, "data.txt"), []byte(hex.EncodeToString(data)), 0o644))
	git(t, repo, "add", "-A")
	git(t, repo, "commit", "-qm", "start")
	require.NoError(t, os.WriteFile(filepath.Join(repo, "secret.log"), []byte("ignored: never uploaded\n"), 0o644))
	base := git(t, repo, "rev-parse", "HEAD")

	script := `set -e; pwd; id -u; stat -c 'owner %u' main.go; cat .git/HEAD; ls secret.log 2>&1 || true
sed -i s/foo/bar/ main.go; echo added > added.txt
mkdir -p .jetcrew/artifacts; echo 42 > .jetcrew/artifacts/report.txt`
	r := run(t, url, jetcrewBin, "submit", "--id", "ws-1", "--wait", "--workspace", repo, script)
	require.Equal(t, 0, r.code, "stdout=%s stderr=%s", r.stdout, r.stderr)
	require.Contains(t, r.stderr, "uploaded")
	lines := strings.Split(r.stdout, "\n")
	require.Equal(t, messages.WorkspaceDir, lines[0], "the workspace is the working directory")
	require.Equal(t, "owner "+lines[1], lines[2], "the tree belongs to the run's user")
	require.Equal(t, "ref: refs/heads/main", lines[3], "history travels")
	require.Contains(t, r.stdout, "No such file", "ignored files stay home")

	st := status(t, url, "ws-1")
	require.Equal(t, messages.StateSucceeded, st.State)
	wr := st.WorkspaceResult
	require.NotNil(t, wr)
	require.Empty(t, wr.Error)
	require.Equal(t, base, wr.Base)
	require.Equal(t, 1, wr.Commits)
	require.Equal(t, 2, wr.FilesChanged)
	require.Equal(t, 2, wr.Insertions)
	require.Equal(t, 1, wr.Deletions)

	res := run(t, url, jetcrewBin, "result", "ws-1")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "2 files, 2 insertions(+), 1 deletions(-)")
	require.Contains(t, res.stdout, "artifact report.txt (3 bytes)")

	// diff: git apply reads it on the base commit.
	d := run(t, url, jetcrewBin, "diff", "ws-1")
	require.Equal(t, 0, d.code, d.stderr)
	clone := t.TempDir()
	git(t, clone, "clone", "-q", repo, ".")
	patch := filepath.Join(t.TempDir(), "p.diff")
	require.NoError(t, os.WriteFile(patch, []byte(d.stdout), 0o644))
	git(t, clone, "apply", "--index", patch)
	got, err := os.ReadFile(filepath.Join(clone, "main.go"))
	require.NoError(t, err)
	require.Contains(t, string(got), "bar")

	// apply: a branch, nothing else touched.
	before := git(t, repo, "status", "--porcelain", "--ignored")
	a := exec.Command(jetcrewBin, "apply", "ws-1")
	a.Dir, a.Env = repo, append(append(os.Environ(), "NATS_URL="+url), authEnv(url, "submitter")...)
	out, err := a.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "branch jetcrew/ws-1")
	require.Equal(t, "main", git(t, repo, "branch", "--show-current"))
	require.Equal(t, base, git(t, repo, "rev-parse", "HEAD"))
	require.Equal(t, before, git(t, repo, "status", "--porcelain", "--ignored"))
	require.Equal(t, "added\n", git(t, repo, "show", "jetcrew/ws-1:added.txt")+"\n")

	// artifacts.
	outFile := filepath.Join(t.TempDir(), "report.txt")
	ar := run(t, url, jetcrewBin, "artifacts", "ws-1", "--get", "report.txt", "-o", outFile)
	require.Equal(t, 0, ar.code, ar.stderr)
	b, err := os.ReadFile(outFile)
	require.NoError(t, err)
	require.Equal(t, "42\n", string(b))

	// A second run on the same snapshot uploads nothing; one object.
	r = run(t, url, jetcrewBin, "submit", "--id", "ws-2", "--wait", "--workspace", repo, "cat main.go")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stderr, "already stored, not uploaded again")
	require.Contains(t, r.stdout, `println("foo")`, "each run starts from the snapshot, not from another run's changes")
	ls := run(t, url, natsBin, "object", "ls", messages.BucketWorkspaces, "--names")
	require.Equal(t, 0, ls.code, ls.stderr)
	require.Len(t, strings.Fields(ls.stdout), 1, ls.stdout)
	d = run(t, url, jetcrewBin, "diff", "ws-2")
	require.Equal(t, 0, d.code, d.stderr)
	require.Empty(t, d.stdout, "a run that changed nothing has an empty diff")

	// Whatever the outcome, the changes are captured: a failure, a timeout,
	// and a run that wrote more than the worker's cap (the result says so;
	// the outcome is the run's own).
	r = run(t, url, jetcrewBin, "submit", "--id", "ws-fail", "--wait", "--workspace", repo, "echo x > f.txt; exit 3")
	require.Equal(t, 3, r.code, r.stderr)
	r = run(t, url, jetcrewBin, "submit", "--id", "ws-timeout", "--timeout", "2s", "--wait", "--workspace", repo, "echo y > g.txt; exec sleep 60")
	require.NotEqual(t, 0, r.code, r.stderr)
	r = run(t, url, jetcrewBin, "submit", "--id", "ws-huge", "--wait", "--workspace", repo, "head -c 2000000 /dev/urandom > huge.bin")
	require.Equal(t, 0, r.code, r.stderr)
	for id, want := range map[string]messages.State{"ws-fail": messages.StateFailed, "ws-timeout": messages.StateTimedOut} {
		st := status(t, url, id)
		require.Equal(t, want, st.State, id)
		require.NotNil(t, st.WorkspaceResult, id)
		require.Equal(t, 1, st.WorkspaceResult.FilesChanged, id)
	}
	// A replay runs on the same snapshot and keeps its own results beside
	// the failed run's.
	failed := status(t, url, "ws-fail")
	r = run(t, url, jetcrewBin, "replay", "--wait", "ws-fail")
	require.Equal(t, 3, r.code, r.stderr)
	replayed := status(t, url, "ws-fail")
	require.Equal(t, 1, replayed.Replays)
	require.Equal(t, 1, replayed.WorkspaceResult.FilesChanged)
	require.NotEqual(t, failed.WorkspaceResult.Objects[0].Name, replayed.WorkspaceResult.Objects[0].Name)
	for _, o := range append(failed.WorkspaceResult.Objects, replayed.WorkspaceResult.Objects...) {
		info := run(t, url, natsBin, "object", "info", messages.BucketResults, o.Name)
		require.Equal(t, 0, info.code, "%s: %s", o.Name, info.stderr)
	}
	st = status(t, url, "ws-huge")
	require.Equal(t, messages.StateSucceeded, st.State)
	require.Contains(t, st.WorkspaceResult.Error, "exceed 1000000 bytes")
}

// TestWorkspaceRefused: a request naming a missing snapshot, a wrong digest
// or a snapshot over the worker's cap fails with that reason and a dead
// letter; it never runs on an empty directory.
func TestWorkspaceRefused(t *testing.T) {
	needsDocker(t)
	profiles := filepath.Join(t.TempDir(), "profiles.toml")
	require.NoError(t, os.WriteFile(profiles, []byte("[profiles.small]\nimage = \"jetcrew-sandbox:latest\"\ncommand = [\"/bin/sh\", \"-c\", \"{prompt}\"]\nrequire_bridge = false\nworkspace_mib = 1\n"), 0o644))
	url, logs := upLogged(t, "--workspace-max-bytes", "100000", "--profiles", profiles)
	t.Cleanup(func() { t.Log(logs.String()) })
	zero := "sha256:" + strings.Repeat("0", 64)
	r := run(t, url, natsBin, "pub", "--jetstream", "jetcrew.runs.default",
		`{"id":"ws-missing","profile":"shell","prompt":"echo ran","workspace":{"name":"nope.tar","digest":"`+zero+`"}}`)
	require.Equal(t, 0, r.code, r.stderr)

	big := t.TempDir()
	blob := make([]byte, 200000)
	_, _ = rand.Read(blob)
	require.NoError(t, os.WriteFile(filepath.Join(big, "blob.bin"), blob, 0o644))
	r = run(t, url, jetcrewBin, "submit", "--id", "ws-big", "--workspace", big, "echo ran")
	require.Equal(t, 0, r.code, r.stderr)

	// A stored object under a digest that is not its own.
	small := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(small, "a.txt"), []byte("a\n"), 0o644))
	r = run(t, url, jetcrewBin, "submit", "--id", "ws-small", "--workspace", small, "true")
	require.Equal(t, 0, r.code, r.stderr)
	m := regexp.MustCompile(`: (sha256-[0-9a-f]{64}\.tar) `).FindStringSubmatch(r.stderr)
	require.NotNil(t, m, r.stderr)
	name := m[1]
	r = run(t, url, natsBin, "pub", "--jetstream", "jetcrew.runs.default",
		`{"id":"ws-digest","profile":"shell","prompt":"echo ran","workspace":{"name":"`+name+`","digest":"`+zero+`"}}`)
	require.Equal(t, 0, r.code, r.stderr)

	// The kernel bounds a tmpfs workspace (profile workspace_mib = 1): a
	// run writing past it gets ENOSPC and ends saying so; the host's disk
	// never sees the bytes.
	r = run(t, url, jetcrewBin, "submit", "--id", "ws-full", "--profile", "small", "--wait", "--workspace", small,
		"mount | grep ' /workspace '; head -c 3000000 /dev/zero > fill.bin")
	require.NotEqual(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "tmpfs on /workspace type tmpfs")
	st := status(t, url, "ws-full")
	require.Equal(t, messages.StateFailed, st.State)
	require.Contains(t, st.Reason, "no space left in the workspace: workspace_mib is 1 MiB")
	require.NotNil(t, st.WorkspaceResult, "the capture ran")
	require.True(t, st.WorkspaceResult.WorkspaceFull, "the result says the workspace was full")

	// Without workspace_mib the kernel still bounds it: the built-in shell
	// profile's workspace is (memory_mib - tmp_mib - home_mib)/2 = 192 MiB.
	r = run(t, url, jetcrewBin, "submit", "--id", "ws-default-full", "--wait", "--workspace", small,
		"df -k /workspace | tail -1; head -c 220000000 /dev/zero > fill.bin")
	require.NotEqual(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, " 196608 ", "a 192 MiB file system")
	st = status(t, url, "ws-default-full")
	require.Equal(t, messages.StateFailed, st.State)
	require.Contains(t, st.Reason, "no space left in the workspace: workspace_mib is 192 MiB")
	for _, id := range []string{"ws-full", "ws-default-full"} {
		requireNoVolumes(t, id)
	}

	for id, want := range map[string]string{"ws-missing": "not found", "ws-big": "this worker takes at most 100000", "ws-digest": "digest mismatch"} {
		st := waitFinal(t, url, id)
		require.Equal(t, messages.StateFailed, st.State, id)
		require.Contains(t, st.Reason, want, id)
		require.Nil(t, st.ExitCode, "%s never ran", id)
		dl := run(t, url, natsBin, "stream", "get", messages.StreamFailed, "-S", messages.SubjectFailed("default", id))
		require.Equal(t, 0, dl.code, "%s has a dead letter: %s", id, dl.stderr)
	}
}

// requireNoVolumes waits up to 30 seconds for run id's workspace volumes to
// be removed (the worker removes them after the final state, before the
// finished event).
func requireNoVolumes(t *testing.T, id string) {
	t.Helper()
	var out []byte
	require.Eventually(t, func() bool {
		var err error
		out, err = exec.Command("docker", "volume", "ls", "-q", "--filter", "label="+jail.LabelRunID+"="+id).Output()
		return err == nil && len(bytes.TrimSpace(out)) == 0
	}, 30*time.Second, 200*time.Millisecond, "volumes of %s left: %s", id, out)
}
