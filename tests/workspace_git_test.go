package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// TestWorkspaceFromGit: `submit --git URL --ref main` on a profile whose
// git_remotes allow a loopback git server. The worker fetches the commit;
// the jailed run sees its tree and history at /workspace; the state names
// the commit; `jetcrew apply` in a clone of the remote gets the run's
// change as a branch on that commit. A second run on the same commit
// fetches nothing; a profile without git_remotes refuses the remote. Run
// with and without --auth: under --auth the worker stores the snapshot and
// the cache object in jetcrew-workspaces as the worker role, and the
// commands act as the submitter.
func TestWorkspaceFromGit(t *testing.T) {
	needsDocker(t)
	for _, mode := range authModes {
		t.Run(mode.name, func(t *testing.T) { testWorkspaceFromGit(t, mode.args) })
	}
}

// testWorkspaceFromGit is TestWorkspaceFromGit on an `up` started with
// upArgs, against a git server of its own.
func testWorkspaceFromGit(t *testing.T, upArgs []string) {
	g := workertest.StartGitServer(t)
	src := g.NewRepo(t, "repo.git", map[string]string{"main.go": "package main\n\nfunc main() { println(\"foo\") }\n"})
	head := workertest.Git(t, src, "rev-parse", "HEAD")
	profiles := filepath.Join(t.TempDir(), "profiles.toml")
	require.NoError(t, os.WriteFile(profiles, fmt.Appendf(nil,
		"[profiles.git]\nimage = \"jetcrew-sandbox:latest\"\ncommand = [\"/bin/sh\", \"-c\", \"{prompt}\"]\nrequire_bridge = false\ngit_remotes = [%q]\n", g.URL+"/*"), 0o644))
	url := up(t, append(slices.Clone(upArgs), "--profiles", profiles)...)
	remote := g.URL + "/repo.git"

	r := run(t, url, jetcrewBin, "submit", "--id", "wg-1", "--wait", "--profile", "git", "--git", remote, "--ref", "main",
		"pwd; cat .git/HEAD; cat main.go; sed -i s/foo/bar/ main.go")
	require.Equal(t, 0, r.code, "stdout=%s stderr=%s", r.stdout, r.stderr)
	require.Contains(t, r.stdout, messages.WorkspaceDir+"\nref: refs/heads/main\npackage main")
	st := status(t, url, "wg-1")
	require.Equal(t, messages.StateSucceeded, st.State)
	require.NotNil(t, st.WorkspaceGit)
	require.Equal(t, remote, st.WorkspaceGit.URL)
	require.Equal(t, head, st.WorkspaceGit.Commit)
	require.NotNil(t, st.Receipt)
	require.Equal(t, st.WorkspaceGit, st.Receipt.WorkspaceGit)
	require.NotNil(t, st.WorkspaceResult)
	require.Empty(t, st.WorkspaceResult.Error)
	require.Equal(t, head, st.WorkspaceResult.Base)
	require.Equal(t, 1, st.WorkspaceResult.FilesChanged)
	res := run(t, url, jetcrewBin, "result", "wg-1")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, int64(1), g.UploadPacks.Load(), "the worker fetched once")
	require.Regexp(t, `source: +`+regexp.QuoteMeta(remote)+` main\n`, res.stdout)

	// apply, in a clone of the remote: a branch on the fetched commit.
	clone := t.TempDir()
	workertest.Git(t, clone, "clone", "-q", remote, ".")
	a := exec.Command(jetcrewBin, "apply", "wg-1")
	a.Dir, a.Env = clone, append(append(os.Environ(), "NATS_URL="+url), authEnv(url, "submitter")...)
	out, err := a.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "branch jetcrew/wg-1")
	require.Equal(t, head, workertest.Git(t, clone, "rev-parse", "jetcrew/wg-1~1"))
	require.Contains(t, workertest.Git(t, clone, "show", "jetcrew/wg-1:main.go"), `println("bar")`)

	// The same commit again: the cached snapshot, no second fetch (the
	// clone above fetched too).
	fetches := g.UploadPacks.Load()
	r = run(t, url, jetcrewBin, "submit", "--id", "wg-2", "--wait", "--profile", "git", "--git", remote, "cat main.go")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, `println("foo")`)
	require.Equal(t, fetches, g.UploadPacks.Load(), "one fetch for two runs on one commit")

	// A profile without git_remotes refuses the remote, before any fetch.
	r = run(t, url, jetcrewBin, "submit", "--id", "wg-3", "--wait", "--git", remote, "true")
	require.NotEqual(t, 0, r.code)
	st = status(t, url, "wg-3")
	require.Equal(t, messages.StateFailed, st.State)
	require.Contains(t, st.Reason, `profile "shell" takes no git sources`)
	require.Equal(t, fetches, g.UploadPacks.Load())
}
