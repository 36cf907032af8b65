package tests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// followupProfiles: the fixture CLIs as Claude Code (twice: a session is
// never fed to another profile) and Gemini CLI (which cannot resume), each
// with the test secret, so the session's mask is seen.
func followupProfiles() string {
	var b strings.Builder
	for _, p := range [][2]string{{"claude", "claude"}, {"claude2", "claude"}, {"gemini", "gemini"}} {
		b.WriteString("[profiles." + p[0] + "]\nbackend = \"" + p[1] + "\"\nimage = \"" + agentsImage + "\"\nenv_from_host = [\"" + backendSecretEnv + "\"]\n" +
			"timeout = \"2m\"\nstall_timeout = \"30s\"\nbridge_deadline = \"30s\"\nfrom_profiles = [\"claude\", \"claude2\", \"gemini\"]\n\n")
	}
	return b.String()
}

// TestFollowup is issue 28's follow-up on real Docker and NATS, with the
// fixture claude CLI, which keeps a session file under
// ~/.claude/projects and, started with --resume, says whether its session
// came back: a run edits a file; `jetcrew followup` from it sees the edit
// and the session restored (the fixture's result says "resumed (1 earlier
// turns)"); a follow-up of the follow-up sees two. The session object is
// masked. A follow-up with another profile, and one of a backend that
// cannot resume (gemini), start fresh and say why.
func TestFollowup(t *testing.T) {
	needsDocker(t)
	requireAgentsImage(t)
	t.Setenv(backendSecretEnv, backendSecret)
	profiles := filepath.Join(t.TempDir(), "profiles.toml")
	require.NoError(t, os.WriteFile(profiles, []byte(followupProfiles()), 0o644))
	url := up(t, "--profiles", profiles, "--concurrency", "4")
	repo := t.TempDir()
	git(t, repo, "init", "-q", "-b", "main")
	require.NoError(t, os.WriteFile(filepath.Join(repo, "main.go"), []byte("package main\n"), 0o644))
	git(t, repo, "add", "-A")
	git(t, repo, "commit", "-qm", "start")

	r := run(t, url, jetcrewBin, "submit", "--id", "fu-1", "--profile", "claude", "--wait", "-q", "--workspace", repo,
		backendPrompt("Edit main.go.", "fixture: write main.go package main // edited", "fixture: leak "+backendSecretEnv))
	require.Equal(t, 0, r.code, "stdout=%s stderr=%s", r.stdout, r.stderr)
	st1 := status(t, url, "fu-1")
	require.NotNil(t, st1.Agent)
	sid := st1.Agent.SessionID
	require.True(t, messages.ValidSessionID(sid), "the CLI's session id is recorded: %q", sid)
	require.NotNil(t, st1.WorkspaceResult)
	require.Empty(t, st1.WorkspaceResult.SessionError)
	var session *messages.ResultObject
	for i, o := range st1.WorkspaceResult.Objects {
		if strings.HasSuffix(o.Name, "/"+messages.ResultSession) {
			session = &st1.WorkspaceResult.Objects[i]
		}
	}
	require.NotNil(t, session, "the session is a result object: %+v", st1.WorkspaceResult.Objects)
	out := filepath.Join(t.TempDir(), "session.tar")
	get := run(t, url, natsBin, "object", "get", messages.BucketResults, session.Name, "--output", out, "--force")
	require.Equal(t, 0, get.code, get.stderr)
	tarBytes, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Contains(t, string(tarBytes), "-workspace/"+sid+".jsonl", "Claude Code's session file, under its project directory")
	require.Contains(t, string(tarBytes), "turn 1: Edit main.go. leak=***", "the transcript, masked")
	require.NotContains(t, string(tarBytes), backendSecret)
	for _, f := range st1.WorkspaceResult.Files {
		require.NotContains(t, f.Path, ".jetcrew", "the session is no part of the tree")
	}

	// The follow-up: the earlier tree and the earlier session.
	r = run(t, url, jetcrewBin, "followup", "--id", "fu-2", "--wait", "-q", "fu-1", backendPrompt("Now check it.", "fixture: cat main.go"))
	require.Equal(t, 0, r.code, "stdout=%s stderr=%s", r.stdout, r.stderr)
	st2 := status(t, url, "fu-2")
	require.Equal(t, messages.StateSucceeded, st2.State, st2.Reason)
	require.Equal(t, "claude", st2.Profile, "the profile defaults to the earlier run's")
	require.Contains(t, st2.Result, "main.go=package main // edited", "the earlier run's edit")
	require.Contains(t, st2.Result, "session "+sid+" resumed (1 earlier turns)", "the earlier session came back")
	require.Equal(t, &messages.SessionNote{From: "fu-1", Resumed: true, ID: sid, Digest: "sha256:" + session.SHA256}, st2.Session)
	require.Equal(t, st2.Session, st2.Receipt.Session, "the receipt names the session restored, by digest")
	require.Equal(t, "fu-1", st2.WorkspaceFrom.Run)
	require.Equal(t, []string{"--resume", sid}, st2.Receipt.Argv[len(st2.Receipt.Argv)-2:])
	res := run(t, url, jetcrewBin, "result", "fu-2")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "resumed "+sid+" of run fu-1")

	// A chain: the follow-up's own session, one turn longer. Claude Code
	// wrote it under a new id, which its init event did not name yet
	// (anthropics/claude-code#4926): the id the run reported last.
	sid2 := st2.Agent.SessionID
	require.NotEqual(t, sid, sid2, "the resumed conversation goes on under the id the CLI reported last")
	r = run(t, url, jetcrewBin, "followup", "--id", "fu-3", "--wait", "-q", "fu-2", backendPrompt("And again."))
	require.Equal(t, 0, r.code, "stdout=%s stderr=%s", r.stdout, r.stderr)
	st3 := status(t, url, "fu-3")
	require.Contains(t, st3.Result, "session "+sid2+" resumed (2 earlier turns)", "fu-2's turn too")
	require.Equal(t, []string{"--resume", sid2}, st3.Receipt.Argv[len(st3.Receipt.Argv)-2:])

	// Another profile: the tree, never the session.
	r = run(t, url, jetcrewBin, "followup", "--id", "fu-other", "--profile", "claude2", "--wait", "-q", "fu-1", backendPrompt("Other.", "fixture: cat main.go"))
	require.Equal(t, 0, r.code, "stdout=%s stderr=%s", r.stdout, r.stderr)
	sto := status(t, url, "fu-other")
	require.Contains(t, sto.Result, "main.go=package main // edited")
	require.NotContains(t, sto.Result, "resumed")
	require.False(t, sto.Session.Resumed)
	require.Contains(t, sto.Session.Fresh, "never fed to another profile")

	// A backend that cannot resume: a fresh session on the earlier tree.
	r = run(t, url, jetcrewBin, "submit", "--id", "fu-g1", "--profile", "gemini", "--wait", "-q", "--workspace", repo, backendPrompt("Edit.", "fixture: write main.go package main // gemini"))
	require.Equal(t, 0, r.code, "stdout=%s stderr=%s", r.stdout, r.stderr)
	r = run(t, url, jetcrewBin, "followup", "--id", "fu-g2", "--wait", "-q", "fu-g1", backendPrompt("Check.", "fixture: cat main.go"))
	require.Equal(t, 0, r.code, "stdout=%s stderr=%s", r.stdout, r.stderr)
	stg := status(t, url, "fu-g2")
	require.Contains(t, stg.Result, "main.go=package main // gemini")
	require.Equal(t, "backend gemini cannot resume a session", stg.Session.Fresh)

	// The session object gone (expired, removed): a fresh session on the
	// same tree, saying so, never the CLI failing on its resume flag.
	rm := run(t, url, natsBin, "object", "rm", messages.BucketResults, session.Name, "-f")
	require.Equal(t, 0, rm.code, rm.stderr)
	r = run(t, url, jetcrewBin, "followup", "--id", "fu-gone", "--wait", "-q", "fu-1", backendPrompt("Check.", "fixture: cat main.go"))
	require.Equal(t, 0, r.code, "stdout=%s stderr=%s", r.stdout, r.stderr)
	stgone := status(t, url, "fu-gone")
	require.Contains(t, stgone.Result, "main.go=package main // edited")
	require.False(t, stgone.Session.Resumed)
	require.Contains(t, stgone.Session.Fresh, "run fu-1's session: ")
	require.Contains(t, stgone.Session.Fresh, "is gone (expired?)")
}
