package worker_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// gitProfiles returns the built-in shell profile allowing remotes, as
// "git", and the shell profile itself (no git remotes).
func gitProfiles(remotes ...string) profile.Profiles {
	p := profile.ShellProfile()
	p.Name, p.GitRemotes = "git", remotes
	return profile.Profiles{"git": p, "shell": profile.ShellProfile()}
}

// workspaceEditor is a fake container that, when /workspace is mounted
// writable as its working directory, prints README's content and .git/HEAD
// and appends a line to README; otherwise it exits 9.
func workspaceEditor(spec jail.ContainerSpec) (workertest.Behaviour, error) {
	return func(_ context.Context, spec jail.ContainerSpec, out jail.OutputFunc) jail.ExitStatus {
		for _, m := range spec.Mounts {
			if m.Target != messages.WorkspaceDir || m.ReadOnly || spec.WorkingDir != m.Target {
				continue
			}
			readme, err1 := os.ReadFile(filepath.Join(m.Source, "README"))
			head, err2 := os.ReadFile(filepath.Join(m.Source, ".git", "HEAD"))
			if err1 != nil || err2 != nil {
				return jail.ExitStatus{Code: 8}
			}
			out("stdout", append(readme, head...))
			if os.WriteFile(filepath.Join(m.Source, "README"), append(readme, "edited\n"...), 0o644) != nil {
				return jail.ExitStatus{Code: 7}
			}
			return jail.ExitStatus{}
		}
		return jail.ExitStatus{Code: 9}
	}, nil
}

// A request naming a git remote the profile allows runs on the ref's
// commit, fetched by the worker from a loopback git server: the tree and
// its history are there, the state, result and receipt name the commit. A
// second run on the same commit takes the cached snapshot: the server sees
// no second fetch. A moved branch is fetched anew.
func TestGitWorkspaceRunsOnTheRefsCommit(t *testing.T) {
	t.Parallel()
	g := workertest.StartGitServer(t)
	src := g.NewRepo(t, "repo", map[string]string{"README": "hello\n"})
	head := workertest.Git(t, src, "rev-parse", "HEAD")
	b := setup(t, func(c *worker.Config) {
		c.Profiles = gitProfiles(g.URL + "/*")
		c.Runtime.(*workertest.Runtime).Behave = workspaceEditor
	})
	ws := &messages.WorkspaceRef{Git: &messages.GitSource{URL: g.URL + "/repo", Ref: "main"}}
	b.submit(t, messages.RunRequest{ID: "g1", Profile: "git", Workspace: ws})
	st := b.waitFinal(t, "g1")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.Equal(t, "hello\nref: refs/heads/main\n", output(b.events(t, "g1"), "stdout"))
	require.NotNil(t, st.WorkspaceGit)
	require.Equal(t, messages.GitSource{URL: g.URL + "/repo", Ref: "main", Commit: head, Digest: st.WorkspaceGit.Digest}, *st.WorkspaceGit)
	require.NotNil(t, st.Receipt)
	require.Equal(t, st.WorkspaceGit, st.Receipt.WorkspaceGit)
	require.NotNil(t, st.WorkspaceResult)
	require.Empty(t, st.WorkspaceResult.Error)
	require.Equal(t, head, st.WorkspaceResult.Base)
	require.Equal(t, 1, st.WorkspaceResult.FilesChanged)
	require.Equal(t, int64(1), g.UploadPacks.Load())

	// The same commit again: listed, not fetched.
	b.submit(t, messages.RunRequest{ID: "g2", Profile: "git", Workspace: ws})
	st2 := b.waitFinal(t, "g2")
	require.Equal(t, messages.StateSucceeded, st2.State, st2.Reason)
	require.Equal(t, *st.WorkspaceGit, *st2.WorkspaceGit)
	require.Equal(t, int64(1), g.UploadPacks.Load(), "the second run on one commit fetches nothing")
	require.Equal(t, int64(2), g.Lists.Load())

	// The branch moves: the new commit is fetched.
	require.NoError(t, os.WriteFile(filepath.Join(src, "README"), []byte("hello again\n"), 0o644))
	workertest.Git(t, src, "commit", "-qam", "second")
	head2 := workertest.Git(t, src, "rev-parse", "HEAD")
	b.submit(t, messages.RunRequest{ID: "g3", Profile: "git", Workspace: ws})
	st3 := b.waitFinal(t, "g3")
	require.Equal(t, messages.StateSucceeded, st3.State, st3.Reason)
	require.Equal(t, head2, st3.WorkspaceGit.Commit)
	require.Equal(t, head2, st3.WorkspaceResult.Base)
	require.Equal(t, int64(2), g.UploadPacks.Load())
}

// A remote the profile does not allow, or any remote for a profile
// without git_remotes, fails the run with the reason and a dead letter
// before anything is fetched; a ref the remote lacks fails the run too.
func TestGitWorkspaceRefused(t *testing.T) {
	t.Parallel()
	g := workertest.StartGitServer(t)
	g.NewRepo(t, "repo", map[string]string{"README": "hello\n"})
	b := setup(t, func(c *worker.Config) {
		c.Profiles = gitProfiles(g.URL + "/allowed/*")
		c.Runtime.(*workertest.Runtime).Behave = workspaceEditor
	})
	for _, tc := range []struct {
		id, profile, url, ref, reason string
		listed                        bool
	}{
		{"gr1", "git", g.URL + "/repo", "main", "is refused: profile \"git\" fetches only from " + g.URL + "/allowed/*", false},
		{"gr2", "git", g.URL + "/allowed/../repo", "main", "is refused", false},
		{"gr3", "shell", g.URL + "/repo", "main", "profile \"shell\" takes no git sources", false},
	} {
		ws := &messages.WorkspaceRef{Git: &messages.GitSource{URL: tc.url, Ref: tc.ref}}
		b.submit(t, messages.RunRequest{ID: tc.id, Profile: tc.profile, Workspace: ws})
		st := b.waitFinal(t, tc.id)
		require.Equal(t, messages.StateFailed, st.State, tc.id)
		require.Contains(t, st.Reason, tc.reason, tc.id)
		dl := b.deadLetter(t, "default", tc.id)
		require.Contains(t, dl.Header.Get(messages.HeaderError), "refused", tc.id)
	}
	require.Zero(t, g.Lists.Load()+g.UploadPacks.Load(), "nothing was asked of the remote")
	require.Empty(t, b.rt.Starts())

	// An allowed remote without the ref.
	src := g.NewRepo(t, "allowed/repo", map[string]string{"README": "hi\n"})
	_ = src
	ws := &messages.WorkspaceRef{Git: &messages.GitSource{URL: g.URL + "/allowed/repo", Ref: "nope"}}
	b.submit(t, messages.RunRequest{ID: "gr4", Profile: "git", Workspace: ws})
	st := b.waitFinal(t, "gr4")
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, 1, st.Attempts, "a missing ref is not retried")
	require.Contains(t, st.Reason, `git ref not found: `+g.URL+`/allowed/repo has no branch, tag or reference "nope"`)
	b.deadLetter(t, "default", "gr4")
	require.Zero(t, g.UploadPacks.Load())
	require.Empty(t, b.rt.Starts())
}

// A remote that cannot be reached hands the request back for a retry, until
// the deliveries run out.
func TestGitWorkspaceUnreachableRetries(t *testing.T) {
	t.Parallel()
	addr := fmt.Sprintf("127.0.0.1:%d", workertest.ReservePort(t)) // nothing listens there
	b := setup(t, func(c *worker.Config) {
		c.Profiles = gitProfiles("http://" + addr + "/*")
		c.Provision.MaxDeliver = 2
	})
	ws := &messages.WorkspaceRef{Git: &messages.GitSource{URL: "http://" + addr + "/repo", Ref: "main"}}
	b.submit(t, messages.RunRequest{ID: "gu1", Profile: "git", Workspace: ws})
	st := b.waitFinal(t, "gu1")
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, 2, st.Attempts)
	require.Contains(t, st.Reason, "gave up after 2 attempts: fetch workspace from git")
	require.True(t, strings.Contains(st.Reason, "connection refused"), st.Reason)
	b.deadLetter(t, "default", "gu1")
}

// git_remotes is checked when profiles load.
func TestGitRemotesValidated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		remotes string
		ok      bool
	}{
		{`["https://git.example.com/org/*"]`, true},
		{`["https://git.example.com/org/repo.git", "http://10.0.0.5:8080/*"]`, true},
		{`["ssh://git@git.example.com/org/*"]`, false},
		{`["git@git.example.com:org/repo.git"]`, false},
		{`["file:///srv/git/*"]`, false},
		{`["/srv/git/repo"]`, false},
		{`["ext::sh -c x"]`, false},
		{`["git://git.example.com/org/*"]`, false},
		{`["https://user:pw@git.example.com/org/*"]`, false},
		{`["https://*.example.com/*"]`, false},
		{`["https://git.example.com/org*"]`, false},
		{`["https://git.example.com/*/repo"]`, false},
		{`["https://git.example.com/org/../*"]`, false},
		{`["https://git.example.com/org/?x=1"]`, false},
		{`["https:///org/*"]`, false},
	} {
		_, err := profile.ParseProfiles("t.toml", []byte("[profiles.p]\nimage = \"x\"\ncommand = [\"true\"]\ngit_remotes = "+tc.remotes+"\n"))
		if tc.ok {
			require.NoError(t, err, tc.remotes)
		} else {
			require.ErrorContains(t, err, "git_remotes", tc.remotes)
		}
	}
}

// The worker's git resolution, in which a run waits for a shared one
// (gitFlight.resolve), and its wait for a fetch slot (acquireFetch), named
// as a stack trace names them, for workertest.Parked.
const (
	gitResolveWait = "github.com/jetcrew/jetcrew/worker/stage/tree.(*gitFlight).resolve"
	gitFetchWait   = "github.com/jetcrew/jetcrew/worker/stage/tree.(*gitFlight).acquireFetch"
)

// Runs on one remote and ref whose resolutions overlap share one: the
// server sees one listing and one fetch for four runs, all on the same
// commit. Fetches of different repositories wait for one of the worker's
// fetch slots: with GitFetches 1 the server never serves two at once,
// with 2 it does (so the first check can fail).
//
// The overlaps are made certain, not hoped for: the server holds the
// listing until all four runs wait on a resolution, and holds the fetches
// until each of the three resolutions has either reached the server or
// waits for a slot.
func TestGitFetchesSharedAndBounded(t *testing.T) {
	t.Parallel()
	for _, slots := range []int{1, 2} {
		t.Run(fmt.Sprintf("slots=%d", slots), func(t *testing.T) {
			t.Parallel()
			g := workertest.StartGitServer(t)
			var b *testBundle
			workertest.Label(t, func() {
				b = setup(t, func(c *worker.Config) {
					c.Profiles = gitProfiles(g.URL + "/*")
					c.Runtime.(*workertest.Runtime).Behave = workspaceEditor
					c.Concurrency = 4
					c.Workspace.GitFetches = slots
				})
			})
			if slots == 1 {
				g.NewRepo(t, "shared", map[string]string{"README": "shared\n"})
				ws := &messages.WorkspaceRef{Git: &messages.GitSource{URL: g.URL + "/shared", Ref: "main"}}
				release := g.HoldListings(t)
				for i := range 4 {
					b.submit(t, messages.RunRequest{ID: fmt.Sprintf("s%d", i), Profile: "git", Workspace: ws})
				}
				require.Eventually(t, func() bool { return workertest.Parked(t, gitResolveWait) == 4 }, 20*time.Second, 5*time.Millisecond,
					"the four runs never all waited on a git resolution (%d listings arrived)", g.Lists.Load())
				release()
				var commits []string
				for i := range 4 {
					st := b.waitFinal(t, fmt.Sprintf("s%d", i))
					require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
					commits = append(commits, st.WorkspaceGit.Commit)
				}
				require.Equal(t, []string{commits[0], commits[0], commits[0], commits[0]}, commits)
				require.Equal(t, int64(1), g.Lists.Load(), "four overlapping runs on one ref list the remote once")
				require.Equal(t, int64(1), g.UploadPacks.Load(), "and fetch once")
			}
			// Three repositories at once.
			before := g.UploadPacks.Load()
			release := g.HoldFetches(t)
			for i := range 3 {
				name := fmt.Sprintf("repo%d", i)
				g.NewRepo(t, name, map[string]string{"README": name + "\n"})
				ws := &messages.WorkspaceRef{Git: &messages.GitSource{URL: g.URL + "/" + name, Ref: "main"}}
				b.submit(t, messages.RunRequest{ID: "d" + name, Profile: "git", Workspace: ws})
			}
			require.Eventually(t, func() bool {
				return g.UploadPacks.Load()-before+int64(workertest.Parked(t, gitFetchWait)) == 3
			}, 20*time.Second, 5*time.Millisecond, "the three resolutions never all reached the server or a wait for a fetch slot")
			release()
			for i := range 3 {
				st := b.waitFinal(t, fmt.Sprintf("drepo%d", i))
				require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
			}
			require.Equal(t, before+3, g.UploadPacks.Load())
			require.Equal(t, int64(slots), g.MaxUploadPacksInFlight.Load(), "fetches at once against the worker's %d slots", slots)
		})
	}
}

// gitCacheObject is the name of the git cache object of a remote's ref at
// commit (docs/workspaces.md: "git/<hex SHA-256 of url, newline, full ref
// name>/<object id>").
func gitCacheObject(url, refName, commit string) string {
	sum := sha256.Sum256([]byte(url + "\n" + refName))
	return "git/" + hex.EncodeToString(sum[:]) + "/" + commit
}

// A git cache entry is used only once its snapshot proves to hold the
// commit the remote lists. An entry planted for the branch's new commit,
// naming the valid snapshot of its old one (as any bucket writer could),
// fails the run before its container starts, without a retry, and is
// deleted: the next run fetches the commit and runs on it. An entry
// claiming another commit than the listed one is ignored: the run
// fetches.
func TestGitCacheEntryCheckedAgainstItsCommit(t *testing.T) {
	t.Parallel()
	g := workertest.StartGitServer(t)
	src := g.NewRepo(t, "repo", map[string]string{"README": "one\n"})
	first := workertest.Git(t, src, "rev-parse", "HEAD")
	b := setup(t, func(c *worker.Config) {
		c.Profiles = gitProfiles(g.URL + "/*")
		c.Runtime.(*workertest.Runtime).Behave = workspaceEditor
	})
	url := g.URL + "/repo"
	ws := &messages.WorkspaceRef{Git: &messages.GitSource{URL: url, Ref: "main"}}
	b.submit(t, messages.RunRequest{ID: "c1", Profile: "git", Workspace: ws})
	st := b.waitFinal(t, "c1")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.Equal(t, first, st.WorkspaceGit.Commit)
	oldSnapshot := st.WorkspaceGit.Digest

	ctx := context.Background()
	obs, err := b.js.ObjectStore(ctx, messages.BucketWorkspaces)
	require.NoError(t, err)
	commit := func(content string) string {
		require.NoError(t, os.WriteFile(filepath.Join(src, "README"), []byte(content), 0o644))
		workertest.Git(t, src, "commit", "-qam", content)
		return workertest.Git(t, src, "rev-parse", "HEAD")
	}
	plant := func(commit, claims string) string {
		name := gitCacheObject(url, "refs/heads/main", commit)
		_, err := obs.PutBytes(ctx, name, fmt.Appendf(nil, `{"digest":%q,"commit":%q}`, oldSnapshot, claims))
		require.NoError(t, err)
		return name
	}

	// The branch moves; its new commit's entry names the old snapshot.
	second := commit("two\n")
	planted := plant(second, second)
	b.submit(t, messages.RunRequest{ID: "c2", Profile: "git", Workspace: ws})
	st = b.waitFinal(t, "c2")
	require.Equal(t, messages.StateFailed, st.State)
	require.Contains(t, st.Reason, "workspace: workspace snapshot does not hold commit "+second+": its HEAD is "+first)
	require.Equal(t, 1, st.Attempts, "not retried")
	b.deadLetter(t, "default", "c2")
	for _, c := range b.rt.Starts() {
		if c.Labels[jail.LabelRunID] == "c2" {
			require.NotEqual(t, jail.RoleRun, c.Labels[jail.LabelRole], "the run's container never started")
		}
	}
	require.Equal(t, int64(1), g.UploadPacks.Load(), "the entry was taken, nothing fetched")
	_, err = obs.GetInfo(ctx, planted)
	require.ErrorIs(t, err, jetstream.ErrObjectNotFound, "the entry is deleted")

	// The next run fetches the commit and runs on it.
	b.submit(t, messages.RunRequest{ID: "c3", Profile: "git", Workspace: ws})
	st = b.waitFinal(t, "c3")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.Equal(t, second, st.WorkspaceGit.Commit)
	require.Equal(t, "two\nref: refs/heads/main\n", output(b.events(t, "c3"), "stdout"))
	require.Equal(t, int64(2), g.UploadPacks.Load())

	// An entry claiming the old commit under the new one's name: ignored.
	third := commit("three\n")
	plant(third, first)
	b.submit(t, messages.RunRequest{ID: "c4", Profile: "git", Workspace: ws})
	st = b.waitFinal(t, "c4")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.Equal(t, third, st.WorkspaceGit.Commit)
	require.Equal(t, "three\nref: refs/heads/main\n", output(b.events(t, "c4"), "stdout"))
	require.Equal(t, int64(3), g.UploadPacks.Load())
}
