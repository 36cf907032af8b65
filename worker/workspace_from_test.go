package worker_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// workspaceCommitter is a fake container that, when /workspace is mounted
// writable as its working directory, prints README, git's log of HEAD and
// git status, then appends a line to README and commits it with the git
// CLI, and appends a line to NOTES that it leaves uncommitted. Without a
// workspace it exits 0.
func workspaceCommitter(spec jail.ContainerSpec) (workertest.Behaviour, error) {
	return func(_ context.Context, spec jail.ContainerSpec, out jail.OutputFunc) jail.ExitStatus {
		for _, m := range spec.Mounts {
			if m.Target != messages.WorkspaceDir || m.ReadOnly || spec.WorkingDir != m.Target {
				continue
			}
			git := func(args ...string) (string, bool) {
				cmd := exec.Command("git", args...)
				cmd.Dir = m.Source
				cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
					"GIT_AUTHOR_NAME=agent", "GIT_AUTHOR_EMAIL=a@x", "GIT_COMMITTER_NAME=agent", "GIT_COMMITTER_EMAIL=a@x")
				b, err := cmd.CombinedOutput()
				return string(b), err == nil
			}
			readme, err := os.ReadFile(filepath.Join(m.Source, "README"))
			if err != nil {
				return jail.ExitStatus{Code: 8}
			}
			log, ok1 := git("log", "--format=%s")
			status, ok2 := git("status", "--porcelain")
			if !ok1 || !ok2 {
				return jail.ExitStatus{Code: 6}
			}
			out("stdout", []byte(string(readme)+"--\n"+log+"--\n"+status))
			n := strings.Count(string(readme), "\n")
			if os.WriteFile(filepath.Join(m.Source, "README"), append(readme, "edited\n"...), 0o644) != nil {
				return jail.ExitStatus{Code: 7}
			}
			if _, ok := git("commit", "-qam", "run "+strings.Repeat("I", n)); !ok {
				return jail.ExitStatus{Code: 5}
			}
			f, err := os.OpenFile(filepath.Join(m.Source, "NOTES"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return jail.ExitStatus{Code: 4}
			}
			f.WriteString("note\n")
			f.Close()
			return jail.ExitStatus{}
		}
		return jail.ExitStatus{}
	}, nil
}

// A run from a run from a run: each sees the earlier run's tree at its
// end, its head (its commit, then jetcrew's commit of what it left
// uncommitted) with the whole history, in a clean work tree; the state,
// receipt and result record the source; a second run from the same
// result reuses the snapshot built for the first.
func TestWorkspaceFromChain(t *testing.T) {
	t.Parallel()
	g := workertest.StartGitServer(t)
	src := g.NewRepo(t, "repo", map[string]string{"README": "hello\n"})
	head := workertest.Git(t, src, "rev-parse", "HEAD")
	b := setup(t, func(c *worker.Config) {
		c.Profiles = gitProfiles(g.URL + "/*")
		c.Runtime.(*workertest.Runtime).Behave = workspaceCommitter
	})
	b.submit(t, messages.RunRequest{ID: "f1", Profile: "git", Workspace: &messages.WorkspaceRef{Git: &messages.GitSource{URL: g.URL + "/repo"}}})
	st1 := b.waitFinal(t, "f1")
	require.Equal(t, messages.StateSucceeded, st1.State, st1.Reason)
	require.Equal(t, st1.WorkspaceGit.Digest, st1.WorkspaceResult.Snapshot, "the result records the snapshot it started from")
	require.Equal(t, 2, st1.WorkspaceResult.Commits, "its commit and one of NOTES, left uncommitted")

	b.submit(t, messages.RunRequest{ID: "f2", Profile: "git", Workspace: &messages.WorkspaceRef{From: "f1"}})
	st2 := b.waitFinal(t, "f2")
	require.Equal(t, messages.StateSucceeded, st2.State, st2.Reason)
	require.Equal(t, "hello\nedited\n--\njetcrew: changes run f1 left uncommitted\nrun I\n"+workertest.Git(t, src, "log", "--format=%s")+"\n--\n", output(b.events(t, "f2"), "stdout"))
	require.NotNil(t, st2.WorkspaceFrom)
	require.Equal(t, "f1", st2.WorkspaceFrom.Run)
	require.Equal(t, st2.WorkspaceFrom, st2.Receipt.WorkspaceFrom)
	require.Equal(t, st2.WorkspaceFrom.Digest, st2.WorkspaceResult.Snapshot)
	require.Equal(t, st1.WorkspaceResult.Head, st2.WorkspaceFrom.Commit)
	require.Equal(t, st1.WorkspaceResult.Head, st2.WorkspaceResult.Base, "the base is f1's head")
	require.NotEqual(t, head, st2.WorkspaceResult.Base)

	b.submit(t, messages.RunRequest{ID: "f3", Profile: "git", Workspace: &messages.WorkspaceRef{From: "f2"}})
	st3 := b.waitFinal(t, "f3")
	require.Equal(t, messages.StateSucceeded, st3.State, st3.Reason)
	require.True(t, strings.HasPrefix(output(b.events(t, "f3"), "stdout"),
		"hello\nedited\nedited\n--\njetcrew: changes run f2 left uncommitted\nrun II\njetcrew: changes run f1 left uncommitted\nrun I\n"), output(b.events(t, "f3"), "stdout"))
	require.Equal(t, st2.WorkspaceResult.Head, st3.WorkspaceResult.Base)

	// From f1 again: the snapshot built for f2 is taken from its cache object.
	b.submit(t, messages.RunRequest{ID: "f2b", Profile: "git", Workspace: &messages.WorkspaceRef{From: "f1"}})
	st2b := b.waitFinal(t, "f2b")
	require.Equal(t, messages.StateSucceeded, st2b.State, st2b.Reason)
	require.Equal(t, *st2.WorkspaceFrom, *st2b.WorkspaceFrom)
	ws, err := b.js.ObjectStore(context.Background(), messages.BucketWorkspaces)
	require.NoError(t, err)
	list, err := ws.List(context.Background())
	require.NoError(t, err)
	var caches int
	for _, o := range list {
		if strings.HasPrefix(o.Name, "from/") {
			caches++
		}
	}
	require.Equal(t, 2, caches, "one cache object per result built from (f1's, f2's)")
}

// An earlier run that does not exist, has no workspace result, or whose
// profiles forbid it fails the run before its container starts, with the
// reason and a dead letter, without a retry.
func TestWorkspaceFromRefused(t *testing.T) {
	t.Parallel()
	g := workertest.StartGitServer(t)
	g.NewRepo(t, "repo", map[string]string{"README": "hello\n"})
	none := []string{}
	b := setup(t, func(c *worker.Config) {
		c.Profiles = gitProfiles(g.URL + "/*")
		for name, mod := range map[string]func(*profile.Profile){
			"nofeed": func(p *profile.Profile) { p.Feeds = &none },
			"nofrom": func(p *profile.Profile) { p.FromProfiles = &none },
			"any":    func(p *profile.Profile) { p.FromProfiles = &[]string{"*"} },
		} {
			p := profile.ShellProfile()
			p.Name, p.GitRemotes = name, []string{g.URL + "/*"}
			mod(&p)
			p, err := p.Resolve()
			require.NoError(t, err)
			c.Profiles[name] = p
		}
		c.Runtime.(*workertest.Runtime).Behave = workspaceCommitter
	})
	gitWS := &messages.WorkspaceRef{Git: &messages.GitSource{URL: g.URL + "/repo"}}
	for _, id := range []string{"src-git", "src-nofeed"} {
		prof := strings.TrimPrefix(id, "src-")
		b.submit(t, messages.RunRequest{ID: id, Profile: prof, Workspace: gitWS})
		st := b.waitFinal(t, id)
		require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	}
	b.submit(t, messages.RunRequest{ID: "src-plain", Profile: "shell", Prompt: "true"})
	require.Equal(t, messages.StateSucceeded, b.waitFinal(t, "src-plain").State)
	starts := len(b.rt.Starts())

	for _, tc := range []struct{ id, profile, from, reason string }{
		{"x1", "git", "nope", "run nope not found"},
		{"x2", "git", "src-plain", `profile "git" starts runs only from runs of git`},
		{"x3", "any", "src-plain", "run src-plain has no workspace result"},
		{"x4", "shell", "src-git", `profile "shell" starts runs only from runs of shell (its from_profiles), not of profile "git"`},
		{"x5", "nofeed", "src-nofeed", `profile "nofeed" lets no run start from its runs (its feeds is empty)`},
		{"x6", "nofrom", "src-git", `profile "nofrom" starts no run from an earlier run's result`},
		{"x7", "git", "x7", "a run cannot start from itself"},
	} {
		b.submit(t, messages.RunRequest{ID: tc.id, Profile: tc.profile, Workspace: &messages.WorkspaceRef{From: tc.from}})
		st := b.waitFinal(t, tc.id)
		require.Equal(t, messages.StateFailed, st.State, tc.id)
		require.Equal(t, 1, st.Attempts, tc.id)
		require.Contains(t, st.Reason, tc.reason, tc.id)
		b.deadLetter(t, "default", tc.id)
	}
	require.Len(t, b.rt.Starts(), starts, "no refused run started a container")
}
