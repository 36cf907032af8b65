package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
