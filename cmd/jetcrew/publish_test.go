package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
	"github.com/jetcrew/jetcrew/workspace"
)

// publishResult stores, on a fresh server, the state and bundle of run
// "pub-1": a finished workspace run of a repository it makes, with one
// commit of its own and a change left uncommitted. It returns the server's
// URL, the repository and the run's head.
func publishResult(t *testing.T) (natsURL, src, head string) {
	t.Helper()
	src = t.TempDir()
	workertest.Git(t, src, "init", "-q", "-b", "main")
	require.NoError(t, os.WriteFile(filepath.Join(src, "a.txt"), []byte("a\n"), 0o644))
	workertest.Git(t, src, "add", "-A")
	workertest.Git(t, src, "commit", "-qm", "first")

	snap := filepath.Join(t.TempDir(), "snap.tar")
	f, err := os.Create(snap)
	require.NoError(t, err)
	_, err = workspace.Snapshot(src, f, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	ws := t.TempDir()
	f, err = os.Open(snap)
	require.NoError(t, err)
	require.NoError(t, workspace.Unpack(f, ws, workspace.UnpackOptions{}))
	f.Close()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "a.txt"), []byte("run\n"), 0o644))
	workertest.Git(t, ws, "commit", "-qam", "the run's commit")
	require.NoError(t, os.WriteFile(filepath.Join(ws, "b.txt"), []byte("left uncommitted\n"), 0o644))
	c, err := workspace.Capture(ws, workspace.CaptureOptions{RunID: "pub-1", Snapshot: snap, Scratch: t.TempDir()})
	require.NoError(t, err)

	s := workertest.StartServer(t)
	js, err := jetstream.New(workertest.Connect(t, s))
	require.NoError(t, err)
	ctx := t.Context()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: messages.StreamEvents, Subjects: []string{messages.SubjectEventsPrefix + ".>"}})
	require.NoError(t, err)
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: messages.BucketResults})
	require.NoError(t, err)
	name := messages.ResultObjectName("pub-1", 1, 1, messages.ResultBundle)
	_, err = obs.PutBytes(ctx, name, c.Bundle)
	require.NoError(t, err)
	r := c.Result
	r.Objects = []messages.ResultObject{{Name: name, Size: int64(len(c.Bundle)), SHA256: sum(string(c.Bundle))}}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: messages.BucketRuns})
	require.NoError(t, err)
	st := messages.RunState{Version: 1, ID: "pub-1", State: messages.StateSucceeded, Profile: "shell", Pool: "default", UpdatedAt: time.Now(), WorkspaceResult: &r}
	data, err := json.Marshal(st)
	require.NoError(t, err)
	_, err = kv.Put(ctx, "pub-1", data)
	require.NoError(t, err)
	return s.ClientURL(), src, r.Head
}

// publish pushes a run's head to a remote of the remotes file, on a git
// server the test starts on loopback: a new branch holds the run's commits;
// after the branch moved, publishing again is refused, and --force
// replaces it; the token never reaches the output; a remote the file does
// not name, a file with an unknown key or a URL with credentials are
// refused; the push is recorded and result shows it; --pr calls the
// endpoint with the branch.
func TestPublishCommand(t *testing.T) {
	t.Parallel()
	natsURL, src, head := publishResult(t)
	g := workertest.StartPushServer(t, "bot", "tok-5ecret")
	remote := g.NewBare(t, "app")

	var mu sync.Mutex
	var prBody map[string]string
	var prAuth string
	forge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		prAuth = r.Header.Get("Authorization")
		_ = json.Unmarshal(b, &prBody)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"html_url": "https://forge.example/acme/app/pull/7"}`)
	}))
	t.Cleanup(forge.Close)

	remotes := filepath.Join(t.TempDir(), "remotes.toml")
	require.NoError(t, os.WriteFile(remotes, []byte(`
[remotes.origin]
url = "`+g.URL+`/app.git"
token_env = "APP_TOKEN"
username = "bot"
pr_url = "`+forge.URL+`/pulls"
pr_base = "main"
`), 0o600))
	env := map[string]string{"NATS_URL": natsURL, "APP_TOKEN": "tok-5ecret", remotesEnv: remotes}
	run := func(args ...string) (int, string, string) {
		t.Helper()
		a := newTestApp(env, nil)
		code := a.run(t.Context(), args)
		out, errOut := a.stdout.String(), a.stderr.String()
		require.NotContains(t, out+errOut, "tok-5ecret", "the token is never printed")
		return code, out, errOut
	}

	code, stdout, stderr := run("publish", "pub-1", "--remote", "origin", "--branch", "agent/pub-1", "--repo", src)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "pushed "+head+" to origin agent/pub-1 ("+g.URL+"/app.git): created")
	require.Equal(t, head, workertest.Git(t, remote, "rev-parse", "refs/heads/agent/pub-1"))
	require.Equal(t, "jetcrew: changes run pub-1 left uncommitted\nthe run's commit\nfirst", workertest.Git(t, remote, "log", "--format=%s", "agent/pub-1"))

	code, stdout, stderr = run("result", "pub-1")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "published "+head+" to origin agent/pub-1 ("+g.URL+"/app.git) at ")

	// The branch moves: refused, left as it is; --force replaces it.
	other := t.TempDir()
	workertest.Git(t, other, "clone", "-q", remote, ".")
	workertest.Git(t, other, "checkout", "-q", "-b", "x", "origin/agent/pub-1~2")
	require.NoError(t, os.WriteFile(filepath.Join(other, "x.txt"), []byte("x\n"), 0o644))
	workertest.Git(t, other, "add", "-A")
	workertest.Git(t, other, "commit", "-qm", "someone else")
	workertest.Git(t, other, "push", "-q", "-f", "origin", "HEAD:refs/heads/agent/pub-1")
	moved := workertest.Git(t, remote, "rev-parse", "refs/heads/agent/pub-1")
	code, _, stderr = run("publish", "pub-1", "--remote", "origin", "--branch", "agent/pub-1", "--repo", src)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "not an ancestor of the run's head")
	require.Contains(t, stderr, "give --force")
	require.Equal(t, moved, workertest.Git(t, remote, "rev-parse", "refs/heads/agent/pub-1"))
	code, stdout, stderr = run("publish", "pub-1", "--remote", "origin", "--branch", "agent/pub-1", "--repo", src, "--force")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "forced over "+moved[:12])
	require.Equal(t, head, workertest.Git(t, remote, "rev-parse", "refs/heads/agent/pub-1"))

	// --pr: the endpoint gets the branch and the token as bearer.
	code, stdout, stderr = run("publish", "pub-1", "--remote", "origin", "--branch", "agent/pub-1", "--repo", src, "--pr", "--pr-title", "Fix it")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, ": already there\n")
	require.Contains(t, stdout, "pull request https://forge.example/acme/app/pull/7\n")
	mu.Lock()
	require.Equal(t, "Bearer tok-5ecret", prAuth)
	require.Equal(t, "Fix it", prBody["title"])
	require.Equal(t, "agent/pub-1", prBody["head"])
	require.Equal(t, "main", prBody["base"])
	mu.Unlock()
	code, stdout, stderr = run("result", "pub-1")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "pull request https://forge.example/acme/app/pull/7")

	// Refused: a remote not in the file, an unknown key, credentials in
	// a URL, a missing token.
	code, _, stderr = run("publish", "pub-1", "--remote", "elsewhere", "--branch", "b", "--repo", src)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `remote "elsewhere" is not in `+remotes+" (its remotes: origin)")
	bad := filepath.Join(t.TempDir(), "bad.toml")
	for body, want := range map[string]string{
		"[remotes.origin]\nurl = \"" + g.URL + "/app.git\"\ntoken = \"x\"\n":                         "unknown key remotes.origin.token",
		"[remotes.origin]\nurl = \"" + strings.Replace(g.URL, "//", "//bot:tok-5ecret@", 1) + "\"\n": "url holds credentials",
		"[remotes.origin]\nurl = \"ssh://git@host/x\"\n":                                             "not an http(s) URL",
		"[remotes.origin]\nurl = \"" + g.URL + "/app.git\"\ntoken_env = \"NOT_SET\"\n":               "NOT_SET (its token_env) is empty",
	} {
		require.NoError(t, os.WriteFile(bad, []byte(body), 0o600))
		code, _, stderr = run("publish", "pub-1", "--remote", "origin", "--branch", "b", "--repo", src, "--remotes", bad)
		require.Equal(t, 1, code, body)
		require.Contains(t, stderr, want)
	}
	code, _, stderr = run("publish", "pub-1", "--branch", "b")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "publish needs --remote and --branch")
}
