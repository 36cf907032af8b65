package tree

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/workspace"
)

// testSecret is the run's secret value in these tests; fakeMask masks it.
const testSecret = "sk-test-5ecret-value"

// fakeMask masks testSecret as the secrets stage's masker does.
type fakeMask struct{}

func (fakeMask) String(s string) string           { return strings.ReplaceAll(s, testSecret, "***") }
func (fakeMask) Stream(_ string, p []byte) []byte { return p }
func (fakeMask) Flush(string) []byte              { return nil }

// sessionObject is a capture's session object holding files (name and
// content; a name ending in "/" is a directory).
func sessionObject(t testing.TB, files ...[2]string) workspace.CaptureObject {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		if strings.HasSuffix(f[0], "/") {
			require.NoError(t, tw.WriteHeader(&tar.Header{Name: f[0], Typeflag: tar.TypeDir, Mode: 0o700}))
			continue
		}
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: f[0], Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(len(f[1]))}))
		_, err := tw.Write([]byte(f[1]))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return workspace.CaptureObject{Kind: "session.tar", Data: io.NewSectionReader(bytes.NewReader(buf.Bytes()), 0, int64(buf.Len())), Size: int64(buf.Len())}
}

// sessionFiles reads back the files of a session object.
func sessionFiles(t *testing.T, o workspace.CaptureObject) map[string]string {
	t.Helper()
	out := map[string]string{}
	tr := tar.NewReader(io.NewSectionReader(o.Data, 0, o.Size))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		out[hdr.Name] = string(b)
	}
}

// The session the worker stores holds only what the backend keeps,
// whoever wrote the rest into the workspace's session directory (an
// agent's process outliving exec's copy); its files are masked; a name
// holding the secret, or a SQLite file holding it, makes the session not
// kept: a name or a database is never rewritten, and never published.
func TestKeptSession(t *testing.T) {
	t.Parallel()
	opencode := workspace.SessionNames{Skip: []string{"auth.json", "bin", "log"}}
	o := sessionObject(t, [2]string{"storage/", ""}, [2]string{"storage/session/s1.json", `{"text":"` + testSecret + `"}`},
		[2]string{"auth.json", `{"key":"attacker"}`}, [2]string{"bin/", ""}, [2]string{"bin/rg", "#!/bin/sh\n"})
	kept, err := keptSession(o, opencode, fakeMask{})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"storage/": "", "storage/session/s1.json": `{"text":"***"}`}, sessionFiles(t, kept))
	kept, err = keptSession(o, opencode, nil)
	require.NoError(t, err)
	require.NotContains(t, sessionFiles(t, kept), "auth.json", "filtered even for a run without secrets")

	_, err = keptSession(sessionObject(t, [2]string{"-workspace/" + testSecret + ".jsonl", "turn\n"}), workspace.SessionNames{}, fakeMask{})
	require.ErrorContains(t, err, "name holds a secret")
	require.NotContains(t, err.Error(), testSecret)

	db := "SQLite format 3\x00" + strings.Repeat("\x00", 84) + "CREATE TABLE threads(id, title)" + testSecret + "\x00\x00"
	wal := "\x37\x7f\x06\x82" + strings.Repeat("\x00", 28) + testSecret
	codex := workspace.SessionNames{Keep: []string{"sessions", "state_*.sqlite", "state_*.sqlite-wal"}}
	for name, content := range map[string]string{"state_5.sqlite": db, "state_5.sqlite-wal": wal} {
		_, err = keptSession(sessionObject(t, [2]string{"sessions/r.jsonl", "x"}, [2]string{name, content}), codex, fakeMask{})
		require.ErrorContains(t, err, name+" is a SQLite file holding a secret value of the run", name)
	}
	clean := strings.ReplaceAll(db, testSecret, "no secret here")
	kept, err = keptSession(sessionObject(t, [2]string{"state_5.sqlite", clean}, [2]string{"config.toml", "x"}), codex, fakeMask{})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"state_5.sqlite": clean}, sessionFiles(t, kept), "a database without a secret is kept byte for byte")
}

// A resumed session the model API refuses at the first answer with a 400
// stops the run, failed, naming the error and followup --fresh; another
// status, a model's answer or a run that resumed nothing goes on.
func TestFirstAnswerRefused(t *testing.T) {
	t.Parallel()
	refusal := profile.Answer{APIStatus: 400, Text: "API Error: 400 {\"message\":\"messages.1: The final block in an assistant message cannot be `thinking`.\"}\nmore"}
	s := &Stage{session: &messages.SessionNote{From: "r-1", Resumed: true, ID: "s-9"}}
	stop := s.FirstAnswer(refusal)
	require.NotNil(t, stop)
	require.Equal(t, messages.StateFailed, stop.State)
	require.Equal(t, "the session s-9 of run r-1, resumed, is refused by the model API at its first answer: "+
		"API Error: 400 {\"message\":\"messages.1: The final block in an assistant message cannot be `thinking`.\"}: "+
		"every request of it is refused alike (its last turn was cut short, as mid-thinking: anthropics/claude-code#63374); "+
		"`jetcrew followup --fresh r-1` starts over on the same tree without it", stop.Reason)
	require.Nil(t, s.FirstAnswer(profile.Answer{}))
	require.Nil(t, s.FirstAnswer(profile.Answer{APIStatus: 401, Text: "API Error: 401"}))
	require.Nil(t, (&Stage{session: &messages.SessionNote{From: "r-1", Fresh: "why"}}).FirstAnswer(refusal))
	require.Nil(t, (&Stage{}).FirstAnswer(refusal))
}

// BenchmarkKeptSession: what storing a session of 200 files, 8 MiB in all
// (half the cap), costs the worker: filtered, re-headed and masked.
func BenchmarkKeptSession(b *testing.B) {
	chunk := strings.Repeat(`{"type":"assistant","text":"x"}`+"\n", (8<<20)/200/33)
	var files [][2]string
	for i := range 200 {
		files = append(files, [2]string{fmt.Sprintf("-workspace/s%03d.jsonl", i), chunk})
	}
	o := sessionObject(b, files...)
	for b.Loop() {
		if _, err := keptSession(o, workspace.SessionNames{}, fakeMask{}); err != nil {
			b.Fatal(err)
		}
	}
}
