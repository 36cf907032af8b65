package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// followup RUN_ID PROMPT submits a run from RUN_ID's tree with
// session.from RUN_ID, the profile and pool RUN_ID's; the shell profile's
// command backend cannot resume, so the run starts fresh and its state and
// `jetcrew result` say why. A run that does not exist is refused before
// anything is published; a second followup with the same id publishes
// nothing.
func TestFollowupCommand(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	rt := workertest.NewTestRuntime(t)
	startWorkerWith(t, s, rt)
	url := s.ClientURL()
	repo := t.TempDir()
	workertest.Git(t, repo, "init", "-q", "-b", "main")
	require.NoError(t, os.WriteFile(filepath.Join(repo, "main.go"), []byte("package main\n"), 0o644))
	workertest.Git(t, repo, "add", ".")
	workertest.Git(t, repo, "commit", "-qm", "first")

	code, _, stderr := cli(t, url, "submit", "--id", "f1", "--wait", "-q", "--workspace", repo, "true")
	require.Equal(t, 0, code, stderr)
	code, _, stderr = cli(t, url, "followup", "--id", "f2", "--wait", "-q", "f1", "true")
	require.Equal(t, 0, code, stderr)
	code, stdout, stderr := cli(t, url, "status", "--json", "f2")
	require.Equal(t, 0, code, stderr)
	var st messages.RunState
	require.NoError(t, json.Unmarshal([]byte(stdout), &st))
	require.Equal(t, "shell", st.Profile, "the earlier run's profile")
	require.Equal(t, "f1", st.WorkspaceFrom.Run)
	require.Equal(t, &messages.SessionNote{From: "f1", Fresh: "backend command cannot resume a session"}, st.Session)
	code, stdout, stderr = cli(t, url, "result", "f2")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "fresh: backend command cannot resume a session")

	code, _, stderr = cli(t, url, "followup", "--id", "f2", "f1", "true")
	require.Equal(t, 1, code, "the same id again publishes nothing: %s", stderr)

	code, _, stderr = cli(t, url, "followup", "nope", "true")
	require.NotEqual(t, 0, code)
	require.Contains(t, stderr, "nope")
	code, _, _ = cli(t, url, "followup")
	require.Equal(t, 2, code, "usage error")
}
