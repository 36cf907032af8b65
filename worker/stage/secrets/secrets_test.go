package secrets

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/stretchr/testify/require"
)

func testMasker(env map[string]string, names ...string) *masker {
	return newMasker(&profile.Profile{AgentConfig: profile.AgentConfig{EnvFromHost: names}}, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
}

// TestMaskerStreams: secrets are masked in a stream however it is cut into
// chunks, nothing else is changed, and short values are left alone.
func TestMaskerStreams(t *testing.T) {
	t.Parallel()
	env := map[string]string{"KEY": "sk-live-12345", "TOK": "abcdef", "SHORT": "1", "UNSET_IS_SKIPPED": ""}
	require.Nil(t, testMasker(env, "SHORT"), "a value under 4 bytes is not masked")
	require.Nil(t, testMasker(env, "NOPE"))
	text := "401 sk-live-12345 then abcdef, sk-live- alone, abcde and 1 and sk-live-12345abcdef\n"
	want := "401 *** then ***, sk-live- alone, abcde and 1 and ******\n"
	for cut := 1; cut <= len(text); cut++ {
		m := testMasker(env, "KEY", "TOK", "SHORT")
		var got strings.Builder
		for i := 0; i < len(text); i += cut {
			got.Write(m.Stream("stdout", []byte(text[i:min(i+cut, len(text))])))
		}
		got.Write(m.Flush("stdout"))
		require.Equal(t, want, got.String(), "chunks of %d bytes", cut)
	}
	m := testMasker(env, "KEY")
	require.Equal(t, "exit code 1: 401 ***", m.String("exit code 1: 401 sk-live-12345"))
	// A held-back prefix that never completes comes out at the end.
	require.Equal(t, "x", string(m.Stream("stderr", []byte("xsk-li"))))
	require.Equal(t, "sk-li", string(m.Flush("stderr")))
	var nilMasker *masker
	require.Equal(t, "as is", nilMasker.String("as is"))
}

// dir is a stage.Dir of a test: its path, and whether it was tainted.
type dir struct {
	path    string
	tainted bool
}

func (d *dir) Path() string    { return d.path }
func (d *dir) Kept() io.Closer { return nil }
func (d *dir) Keep(io.Closer)  {}
func (d *dir) Taint()          { d.tainted = true }

// TestStageBindsSecretsLate: the values go into the run directory's env
// file for the launcher, readable by the run's user, the directory is
// kept out of the pool, the receipt gets the names, the engine the
// masker; a variable the worker lacks fails the run.
func TestStageBindsSecretsLate(t *testing.T) {
	t.Parallel()
	env := map[string]string{"API_KEY": "sk-live-12345", "TOKEN": "tok-abcdef"}
	s := New(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	p := profile.ShellProfile()
	p.EnvFromHost = []string{"API_KEY", "TOKEN"}
	d := &dir{path: t.TempDir()}
	run := &stage.Run{Profile: &p}
	var resp stage.PrestartResponse
	require.NoError(t, s.For(run).Prestart(t.Context(), &stage.PrestartRequest{Run: run, Dir: d}, &resp))
	data, err := os.ReadFile(filepath.Join(d.path, "launch-env.json"))
	require.NoError(t, err)
	var got []string
	require.NoError(t, json.Unmarshal(data, &got))
	require.Equal(t, []string{"API_KEY=sk-live-12345", "TOKEN=tok-abcdef"}, got)
	fi, err := os.Stat(filepath.Join(d.path, "launch-env.json"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o444), fi.Mode().Perm())
	require.True(t, d.tainted, "a directory that held secrets is never pooled")
	require.Equal(t, []string{"API_KEY", "TOKEN"}, resp.LaunchEnvNames)
	require.NotNil(t, resp.Mask)
	require.Equal(t, "key *** and ***", resp.Mask.String("key sk-live-12345 and tok-abcdef"))

	p.EnvFromHost = []string{"API_KEY", "MISSING"}
	err = s.For(run).Prestart(t.Context(), &stage.PrestartRequest{Run: run, Dir: &dir{path: t.TempDir()}}, &stage.PrestartResponse{})
	require.EqualError(t, err, `profile "shell": env_from_host MISSING is not set in the worker's environment`)
}
