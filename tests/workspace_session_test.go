package tests

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// sessionProfiles: the fixture CLIs as Claude Code, Codex and opencode,
// each with the test secret; claude-thinking retries a failed run once
// and stalls after 3 s of silence (a turn interrupted mid-thinking).
func sessionProfiles() string {
	var b strings.Builder
	for _, p := range [][3]string{{"claude", "claude", ""}, {"codex", "codex", ""}, {"opencode", "opencode", ""},
		{"claude-thinking", "claude", "retries = 1\nstall_timeout = \"3s\"\n"}} {
		extra := p[2]
		if extra == "" {
			extra = "stall_timeout = \"30s\"\n"
		}
		b.WriteString("[profiles." + p[0] + "]\nbackend = \"" + p[1] + "\"\nimage = \"" + agentsImage + "\"\nenv_from_host = [\"" + backendSecretEnv + "\"]\n" +
			"timeout = \"2m\"\nbridge_deadline = \"30s\"\n" + extra + "\n")
	}
	return b.String()
}

// sessionEnv starts `jetcrew up` with sessionProfiles and returns its URL
// and a git repository to submit.
func sessionEnv(t *testing.T) (url, repo string) {
	t.Helper()
	needsDocker(t)
	requireAgentsImage(t)
	t.Setenv(backendSecretEnv, backendSecret)
	profiles := filepath.Join(t.TempDir(), "profiles.toml")
	require.NoError(t, os.WriteFile(profiles, []byte(sessionProfiles()), 0o644))
	url = up(t, "--profiles", profiles, "--concurrency", "4")
	repo = t.TempDir()
	git(t, repo, "init", "-q", "-b", "main")
	require.NoError(t, os.WriteFile(filepath.Join(repo, "main.go"), []byte("package main\n"), 0o644))
	git(t, repo, "add", "-A")
	git(t, repo, "commit", "-qm", "start")
	return url, repo
}

// sessionObject returns st's session.tar result object, nil when none.
func sessionObject(st messages.RunState) *messages.ResultObject {
	if st.WorkspaceResult == nil {
		return nil
	}
	for i, o := range st.WorkspaceResult.Objects {
		if strings.HasSuffix(o.Name, "/"+messages.ResultSession) {
			return &st.WorkspaceResult.Objects[i]
		}
	}
	return nil
}

// getObject returns the bytes of result object o, read as a submitter
// reads it.
func getObject(t *testing.T, url string, o *messages.ResultObject) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "object")
	get := run(t, url, natsBin, "object", "get", messages.BucketResults, o.Name, "--output", out, "--force")
	require.Equal(t, 0, get.code, get.stderr)
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	return string(b)
}

// tarFiles returns the regular files of a tar, by name.
func tarFiles(t *testing.T, data string) map[string]string {
	t.Helper()
	files := map[string]string{}
	tr := tar.NewReader(strings.NewReader(data))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		if hdr.Typeflag == tar.TypeReg {
			files[hdr.Name] = string(b)
		}
	}
}

// submitOK runs a jetcrew command that must succeed.
func submitOK(t *testing.T, url string, args ...string) {
	t.Helper()
	r := run(t, url, jetcrewBin, args...)
	require.Equal(t, 0, r.code, "%v: stdout=%s stderr=%s", args, r.stdout, r.stderr)
}

// TestFollowupCodex: current Codex (0.137 and later) finds a thread to
// resume through its state database, not its rollout files alone; the
// fixture codex does the same. A follow-up restores both (and nothing
// else of CODEX_HOME: not its credentials, not its config.toml) and
// resumes, a chain twice. A run whose state database holds the secret
// keeps no session (a database is never masked), and its follow-up starts
// fresh saying why.
func TestFollowupCodex(t *testing.T) {
	url, repo := sessionEnv(t)
	submitOK(t, url, "submit", "--id", "cx-1", "--profile", "codex", "--wait", "-q", "--workspace", repo,
		backendPrompt("Edit main.go.", "fixture: write main.go package main // codex", "fixture: leak "+backendSecretEnv))
	st1 := status(t, url, "cx-1")
	require.NotNil(t, st1.Agent)
	tid := st1.Agent.SessionID
	require.True(t, messages.ValidSessionID(tid), tid)
	obj := sessionObject(st1)
	require.NotNil(t, obj, "%+v", st1.WorkspaceResult)

	submitOK(t, url, "followup", "--id", "cx-2", "--wait", "-q", "cx-1", backendPrompt("Check.", "fixture: cat main.go"))
	st2 := status(t, url, "cx-2")
	require.Equal(t, messages.StateSucceeded, st2.State, st2.Reason)
	require.Contains(t, st2.Result, "main.go=package main // codex")
	require.Contains(t, st2.Result, "session "+tid+" resumed (1 earlier turns)", "Codex found its thread back")
	require.True(t, st2.Session.Resumed, "%+v", st2.Session)
	submitOK(t, url, "followup", "--id", "cx-3", "--wait", "-q", "cx-2", backendPrompt("Again."))
	require.Contains(t, status(t, url, "cx-3").Result, "session "+tid+" resumed (2 earlier turns)")

	files := tarFiles(t, getObject(t, url, obj))
	var names []string
	for name, content := range files {
		names = append(names, name)
		require.NotContains(t, content, backendSecret, name)
		require.NotContains(t, content, "[mcp_servers", name)
		if strings.HasPrefix(name, "sessions/") {
			require.Contains(t, content, "leak=***", "the rollout, masked")
		}
	}
	require.Len(t, names, 2, "%v", names)
	require.Contains(t, names, "state_5.sqlite", "Codex's thread index is kept")
	require.Regexp(t, `(?m)^sessions/\d{4}/\d\d/\d\d/rollout-.*-`+tid+`\.jsonl$`, strings.Join(names, "\n"), "its rollout, and nothing else of CODEX_HOME")

	submitOK(t, url, "submit", "--id", "cx-db1", "--profile", "codex", "--wait", "-q", "--workspace", repo,
		backendPrompt("Edit.", "fixture: leak-db "+backendSecretEnv))
	sdb := status(t, url, "cx-db1")
	require.Nil(t, sessionObject(sdb), "a database holding the secret is not kept")
	require.Contains(t, sdb.WorkspaceResult.SessionError, "state_5.sqlite is a SQLite file holding a secret value of the run")
	submitOK(t, url, "followup", "--id", "cx-db2", "--wait", "-q", "cx-db1", backendPrompt("Check."))
	sdb2 := status(t, url, "cx-db2")
	require.False(t, sdb2.Session.Resumed)
	require.Contains(t, sdb2.Session.Fresh, "kept no session: not kept: state_5.sqlite is a SQLite file holding a secret")
}

// TestFollowupForgedSession is issue 36's attack: an agent that writes its
// own .jetcrew/session (the CLI's files plus credentials and a binary) and
// moves the CLI's directory away keeps nothing, and its follow-up's CLI
// starts with neither; a run that names a file after the secret keeps no
// session, so the secret is in no object's names.
func TestFollowupForgedSession(t *testing.T) {
	url, repo := sessionEnv(t)
	submitOK(t, url, "submit", "--id", "fo-1", "--profile", "opencode", "--wait", "-q", "--workspace", repo,
		backendPrompt("Edit.", "fixture: forge-session"))
	submitOK(t, url, "followup", "--id", "fo-2", "--wait", "-q", "fo-1", backendPrompt("Check.",
		"fixture: stat ~/.local/share/opencode/auth.json", "fixture: stat ~/.local/share/opencode/bin/rg"))
	st2 := status(t, url, "fo-2")
	require.Contains(t, st2.Result, "~/.local/share/opencode/auth.json=absent", "the forged credentials never reach the CLI")
	require.Contains(t, st2.Result, "~/.local/share/opencode/bin/rg=absent", "nor the forged binary")
	require.Contains(t, st2.Session.Fresh, "run fo-1 kept no session")
	st1 := status(t, url, "fo-1")
	require.Nil(t, sessionObject(st1), "the forged session is not kept: %+v", st1.WorkspaceResult)

	submitOK(t, url, "submit", "--id", "fn-1", "--profile", "claude", "--wait", "-q", "--workspace", repo,
		backendPrompt("Edit.", "fixture: leak-name "+backendSecretEnv))
	sn := status(t, url, "fn-1")
	require.Nil(t, sessionObject(sn), "a session whose names hold the secret is not kept")
	require.Contains(t, sn.WorkspaceResult.SessionError, "an entry's name holds a secret value of the run")
	require.NotContains(t, sn.WorkspaceResult.SessionError, backendSecret)
	for _, o := range sn.WorkspaceResult.Objects {
		require.NotContains(t, getObject(t, url, &o), backendSecret, o.Name)
	}
}

// TestFollowupSessionLost: a kept session that does not hold the file of
// the id its run reported (the CLI moved it, an older worker kept another
// layout) is not resumed: the follow-up starts fresh on the same tree and
// says why, rather than the CLI failing on its own resume flag (whose
// exit would be blamed on the bridge it never started).
func TestFollowupSessionLost(t *testing.T) {
	url, repo := sessionEnv(t)
	submitOK(t, url, "submit", "--id", "sl-1", "--profile", "claude", "--wait", "-q", "--workspace", repo,
		backendPrompt("Edit.", "fixture: write main.go package main // lost", "fixture: lose-session"))
	st1 := status(t, url, "sl-1")
	require.NotNil(t, sessionObject(st1), "a session is kept: %+v", st1.WorkspaceResult)
	submitOK(t, url, "followup", "--id", "sl-2", "--wait", "-q", "sl-1", backendPrompt("Check.", "fixture: cat main.go"))
	st2 := status(t, url, "sl-2")
	require.Equal(t, messages.StateSucceeded, st2.State, st2.Reason)
	require.Contains(t, st2.Result, "main.go=package main // lost")
	require.False(t, st2.Session.Resumed)
	require.Equal(t, "run sl-1's session holds no session file of id "+st1.Agent.SessionID+": not resumed", st2.Session.Fresh)
}

// TestFollowupInterruptedSession: a run stopped while its model was
// thinking leaves a session ending in a thinking block, and the model API
// refuses every request of it with a 400 (anthropics/claude-code#63374).
// Its follow-up fails at the first answer with that error named, not
// retried though its profile retries, and says the way out: `followup
// --fresh`, which starts the agent without the session on the same tree.
func TestFollowupInterruptedSession(t *testing.T) {
	url, repo := sessionEnv(t)
	submitOK(t, url, "submit", "--id", "th-0", "--profile", "claude-thinking", "--wait", "-q", "--workspace", repo,
		backendPrompt("Edit.", "fixture: write main.go package main // thought"))
	r := run(t, url, jetcrewBin, "followup", "--id", "th-1", "--wait", "-q", "th-0", backendPrompt("Think hard.", "fixture: interrupt-thinking"))
	st1 := status(t, url, "th-1")
	require.Equal(t, messages.StateStalled, st1.State, st1.Reason)
	require.NotEqual(t, 0, r.code)
	require.True(t, st1.Session.Resumed)
	require.NotEqual(t, st1.Session.ID, st1.Agent.SessionID, "stopped before its result, the run reported its new session id in its messages")
	require.NotNil(t, sessionObject(st1), "the interrupted session is kept: %+v", st1.WorkspaceResult)

	r = run(t, url, jetcrewBin, "followup", "--id", "th-2", "--wait", "-q", "th-1", backendPrompt("Go on."))
	require.NotEqual(t, 0, r.code)
	st2 := status(t, url, "th-2")
	require.Equal(t, messages.StateFailed, st2.State)
	require.True(t, st2.Session.Resumed)
	require.Equal(t, st1.Agent.SessionID, st2.Session.ID)
	require.Contains(t, st2.Reason, "is refused by the model API at its first answer: API Error: 400 ")
	require.Contains(t, st2.Reason, "The final block in an assistant message cannot be `thinking`.")
	require.Contains(t, st2.Reason, "`jetcrew followup --fresh th-1`")
	require.Equal(t, 1, st2.Attempts, "a refused session is never retried: %s", st2.Reason)

	submitOK(t, url, "followup", "--fresh", "--id", "th-3", "--wait", "-q", "th-1", backendPrompt("Start over.", "fixture: cat main.go"))
	st3 := status(t, url, "th-3")
	require.Equal(t, messages.StateSucceeded, st3.State, st3.Reason)
	require.Contains(t, st3.Result, "main.go=package main // thought", "the same tree")
	require.NotContains(t, st3.Result, "resumed")
	require.Nil(t, st3.Session, "no session asked for")
	require.Equal(t, "th-1", st3.WorkspaceFrom.Run)
	require.NotContains(t, strings.Join(st3.Receipt.Argv, " "), "--resume")
}
