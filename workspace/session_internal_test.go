package workspace

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
	require.NoError(t, os.WriteFile(path, []byte(data), 0o600))
}

// A session goes from the CLI's directory into the workspace (exec, after
// the agent), out as a tar (the capture) and back into another run's
// session directory (exec, before the agent): regular files only.
func TestSessionRoundTrip(t *testing.T) {
	src, ws, dst := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "home", ".claude", "projects")
	writeFile(t, src+"/-workspace/s1.jsonl", "turn 1\n")
	writeFile(t, src+"/-workspace/sub/todo.json", "{}")
	require.NoError(t, os.Symlink("/etc/passwd", src+"/-workspace/link"))
	writeFile(t, src+"/auth.json", "credentials")
	writeFile(t, src+"/-workspace/auth.json", "kept: not directly in the directory")
	writeFile(t, ws+"/"+messages.SessionDir+"/planted.txt", "the agent's own") // replaced
	require.NoError(t, saveSession(src, ws, SessionNames{Skip: []string{"auth.json"}}))
	require.NoFileExists(t, ws+"/"+messages.SessionDir+"/auth.json", "skipped")
	require.FileExists(t, ws+"/"+messages.SessionDir+"/-workspace/auth.json")
	require.NoFileExists(t, ws+"/"+messages.SessionDir+"/planted.txt")
	require.NoFileExists(t, ws+"/"+messages.SessionDir+"/-workspace/link")

	root, err := os.OpenRoot(ws)
	require.NoError(t, err)
	defer root.Close()
	data, why := sessionTar(root, refusedPaths{})
	require.Empty(t, why)
	f := filepath.Join(t.TempDir(), "session.tar")
	require.NoError(t, os.WriteFile(f, data, 0o444))
	require.NoError(t, restoreSession(f, dst, SessionNames{}))
	b, err := os.ReadFile(dst + "/-workspace/s1.jsonl")
	require.NoError(t, err)
	require.Equal(t, "turn 1\n", string(b))
	require.FileExists(t, dst+"/-workspace/sub/todo.json")

	// No session directory: nothing kept, no error.
	require.NoError(t, saveSession(filepath.Join(src, "none"), t.TempDir(), SessionNames{}))
}

// Over messages.MaxSessionBytes, exec keeps none (its marker says why) and
// the capture records why; a session directory the agent filled past the
// cap itself is refused by the capture; a session tar over the cap, or
// with a name leaving the directory, is not restored.
func TestSessionCap(t *testing.T) {
	src, ws := t.TempDir(), t.TempDir()
	big := make([]byte, messages.MaxSessionBytes/2+1)
	writeFile(t, src+"/a.jsonl", string(big))
	writeFile(t, src+"/b.jsonl", string(big))
	require.ErrorContains(t, saveSession(src, ws, SessionNames{}), "over the cap")
	root, err := os.OpenRoot(ws)
	require.NoError(t, err)
	defer root.Close()
	data, why := sessionTar(root, refusedPaths{})
	require.Nil(t, data)
	require.Contains(t, why, "over the cap of 16777216")

	ws2 := t.TempDir()
	writeFile(t, ws2+"/"+messages.SessionDir+"/a.jsonl", string(big))
	writeFile(t, ws2+"/"+messages.SessionDir+"/b.jsonl", string(big))
	root2, err := os.OpenRoot(ws2)
	require.NoError(t, err)
	defer root2.Close()
	data, why = sessionTar(root2, refusedPaths{})
	require.Nil(t, data)
	require.Contains(t, why, "over the cap")

	tarOf := func(entries map[string]int) string {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for name, size := range entries {
			require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(size)}))
			_, err := tw.Write(make([]byte, size))
			require.NoError(t, err)
		}
		require.NoError(t, tw.Close())
		f := filepath.Join(t.TempDir(), "s.tar")
		require.NoError(t, os.WriteFile(f, buf.Bytes(), 0o444))
		return f
	}
	require.ErrorIs(t, restoreSession(tarOf(map[string]int{"a": messages.MaxSessionBytes + 1}), t.TempDir(), SessionNames{}), ErrTooLarge)
	require.ErrorIs(t, restoreSession(tarOf(map[string]int{"../escape": 1}), t.TempDir(), SessionNames{}), ErrBadArchive)
}

// exec --session runs the agent as its child, ends as it ended (its exit
// code; the signal that killed it) and keeps its session files either way.
func TestRunKeepingSession(t *testing.T) {
	ws, home := t.TempDir(), t.TempDir()
	sess := home + "/.claude/projects"
	a := JailArgs{Command: "exec", Dir: ws, Session: sess,
		Argv: []string{"/bin/sh", "-c", `mkdir -p "$0/p" && echo turn > "$0/p/s.jsonl" && exit 3`, sess}}
	var stderr bytes.Buffer
	require.Equal(t, 3, runKeepingSession(a, &stderr), stderr.String())
	b, err := os.ReadFile(ws + "/" + messages.SessionDir + "/p/s.jsonl")
	require.NoError(t, err)
	require.Equal(t, "turn\n", string(b))

	// Killed by a signal: exec ends by the same signal (here only
	// noted), else 128+n; the session is kept.
	var raised syscall.Signal
	defer func(f func(syscall.Signal)) { raiseSignal = f }(raiseSignal)
	raiseSignal = func(sig syscall.Signal) { raised = sig }
	a.Argv = []string{"/bin/sh", "-c", `echo two > "$0/p/s.jsonl"; kill -KILL $$`, sess}
	require.Equal(t, 128+9, runKeepingSession(a, &stderr))
	require.Equal(t, syscall.SIGKILL, raised)
	b, err = os.ReadFile(ws + "/" + messages.SessionDir + "/p/s.jsonl")
	require.NoError(t, err)
	require.Equal(t, "two\n", string(b))
}

// BenchmarkSessionKeepRestore: what a session of 200 files, 8 MiB in all
// (half the cap), costs exec after the agent (saveSession), the capture
// (sessionTar) and the follow-up's exec before it (restoreSession).
func BenchmarkSessionKeepRestore(b *testing.B) {
	src := b.TempDir()
	chunk := bytes.Repeat([]byte("{\"type\":\"assistant\",\"text\":\"x\"}\n"), (8<<20)/200/33)
	for i := range 200 {
		p := filepath.Join(src, "-workspace", fmt.Sprintf("s%03d.jsonl", i))
		require.NoError(b, os.MkdirAll(filepath.Dir(p), 0o700))
		require.NoError(b, os.WriteFile(p, chunk, 0o600))
	}
	for b.Loop() {
		ws := b.TempDir()
		require.NoError(b, saveSession(src, ws, SessionNames{}))
		root, err := os.OpenRoot(ws)
		require.NoError(b, err)
		data, why := sessionTar(root, refusedPaths{})
		root.Close()
		require.Empty(b, why)
		f := filepath.Join(ws, "s.tar")
		require.NoError(b, os.WriteFile(f, data, 0o444))
		require.NoError(b, restoreSession(f, filepath.Join(ws, "home"), SessionNames{}))
	}
}

// An agent that moves the CLI's session directory away and writes its own
// messages.SessionDir (the CLI's files plus credentials and a binary) keeps
// nothing: exec clears SessionDir first, whatever the source.
func TestSaveSessionClearsPlanted(t *testing.T) {
	for name, src := range map[string]func(t *testing.T) string{
		"missing":   func(t *testing.T) string { return filepath.Join(t.TempDir(), "moved-away") },
		"not-a-dir": func(t *testing.T) string { p := filepath.Join(t.TempDir(), "f"); writeFile(t, p, "x"); return p },
		"a-symlink": func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "l")
			require.NoError(t, os.Symlink(t.TempDir(), p))
			return p
		},
	} {
		t.Run(name, func(t *testing.T) {
			ws := t.TempDir()
			writeFile(t, ws+"/"+messages.SessionDir+"/storage/session/s1.json", "{}")
			writeFile(t, ws+"/"+messages.SessionDir+"/auth.json", `{"key":"attacker"}`)
			writeFile(t, ws+"/"+messages.SessionDir+"/bin/rg", "#!/bin/sh\n")
			_ = saveSession(src(t), ws, SessionNames{Skip: []string{"auth.json", "bin", "log"}})
			require.NoDirExists(t, ws+"/"+messages.SessionDir, "a planted session directory is never kept")
		})
	}
}

// The backend's names decide what is kept and what is restored: Codex's
// keep list (its sessions and state database, never its credentials or
// configuration), opencode's skip list; a tar holding other names (written
// after exec's copy, or forged) has them dropped on restore.
func TestSessionNames(t *testing.T) {
	codex := SessionNames{Keep: []string{"sessions", "state_*.sqlite", "state_*.sqlite-wal"}}
	opencode := SessionNames{Skip: []string{"auth.json", "bin", "log"}}
	for rel, want := range map[string][2]bool{ // codex, opencode
		"sessions/2026/01/02/rollout-x.jsonl": {true, true},
		"state_5.sqlite":                      {true, true},
		"state_5.sqlite-wal":                  {true, true},
		"state_5.sqlite-shm":                  {false, true},
		"auth.json":                           {false, false},
		"config.toml":                         {false, true},
		"bin/rg":                              {false, false},
		"log/opencode.log":                    {false, false},
		"storage/session/auth.json":           {false, true},
	} {
		require.Equal(t, want[0], codex.Kept(rel), "codex %s", rel)
		require.Equal(t, want[1], opencode.Kept(rel), "opencode %s", rel)
	}

	src, ws := t.TempDir(), t.TempDir()
	for _, f := range []string{"sessions/2026/01/02/rollout-1-t1.jsonl", "state_5.sqlite", "state_5.sqlite-wal", "auth.json", "config.toml", "logs_2.sqlite"} {
		writeFile(t, src+"/"+f, f)
	}
	require.NoError(t, saveSession(src, ws, codex))
	var kept []string
	require.NoError(t, filepath.WalkDir(ws+"/"+messages.SessionDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(ws+"/"+messages.SessionDir, p)
			kept = append(kept, rel)
		}
		return err
	}))
	require.ElementsMatch(t, []string{"sessions/2026/01/02/rollout-1-t1.jsonl", "state_5.sqlite", "state_5.sqlite-wal"}, kept)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []string{"storage/session/s1.json", "auth.json", "bin/rg", "log/x.log"} {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: f, Typeflag: tar.TypeReg, Mode: 0o600, Size: 2}))
		_, err := tw.Write([]byte("{}"))
		require.NoError(t, err)
	}
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o700}))
	require.NoError(t, tw.Close())
	f := filepath.Join(t.TempDir(), "session.tar")
	require.NoError(t, os.WriteFile(f, buf.Bytes(), 0o444))
	dst := filepath.Join(t.TempDir(), "opencode")
	require.NoError(t, restoreSession(f, dst, opencode))
	require.FileExists(t, dst+"/storage/session/s1.json")
	require.NoFileExists(t, dst+"/auth.json", "credentials are never restored")
	require.NoDirExists(t, dst+"/bin", "nor downloaded binaries")
	require.NoDirExists(t, dst+"/log")
}
