package runner

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
)

var update = flag.Bool("update", false, "rewrite golden files")

// requireGolden compares v, as indented JSON and a newline, with
// testdata/name, which -update rewrites first.
func requireGolden(t *testing.T, name string, v any, msgAndArgs ...any) {
	t.Helper()
	got, err := json.MarshalIndent(v, "", "  ")
	require.NoError(t, err)
	got = append(got, '\n')
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), msgAndArgs...)
}

func TestBuildSpecShellGolden(t *testing.T) {
	t.Parallel()
	shell := profile.ShellProfile()
	plan, err := shell.Plan("echo hi", false)
	require.NoError(t, err)
	spec := BuildSpec(SpecInput{
		Plan:    plan,
		Profile: &shell,
		Request: messages.RunRequest{ID: "r1", Profile: "shell", Prompt: "echo hi", Group: "g",
			Env: map[string]string{"B": "2", "A": "1"}}.WithDefaults(),
		Attempt:  2,
		WorkerID: "w1",
		Now:      time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC),
	})
	requireGolden(t, "spec-shell.json", spec)
}

func TestBuildSpecJail(t *testing.T) {
	t.Parallel()
	p := profile.ShellProfile()
	p.EnvFromHost = []string{"API_KEY"}
	p.Env = map[string]string{"FIXED": "1"}
	plan, err := p.Plan("x", false)
	require.NoError(t, err)
	spec := BuildSpec(SpecInput{
		Plan:    plan,
		Profile: &p,
		// The request tries to override jetcrew's own and the profile's variables.
		Request:  messages.RunRequest{ID: "r2", Profile: "shell", Prompt: "x", Env: map[string]string{"FIXED": "0", "HOME": "/"}},
		Attempt:  1,
		WorkerID: "w",
		Now:      time.Now(),
	})
	require.Equal(t, "jetcrew-r2-0-1", spec.Name)
	require.Equal(t, "65532:65532", spec.User)
	require.Equal(t, "none", spec.Network)
	require.Equal(t, int64(512<<20), spec.MemoryBytes)
	require.Equal(t, int64(1e9), spec.NanoCPUs)
	require.Equal(t, int64(256), spec.PidsLimit)
	require.Equal(t, "size=64m,mode=1777", tmpfsOptions(spec, "/tmp"))
	require.Equal(t, "size=64m,mode=0700,uid=65532,gid=65532", tmpfsOptions(spec, "/home/agent"))
	// The profile's secret is bound by the launcher at start (the secrets
	// stage stages its value), never in the container's configuration.
	require.Equal(t, []string{profile.LaunchPath, "launch", "--env-file", profile.LaunchEnvPath, "--", "/bin/sh", "-c", "x"}, spec.Cmd)
	// Docker takes the last of repeated variables: the profile's and
	// jetcrew's own come after the request's.
	last := map[string]string{}
	for _, kv := range spec.Env {
		k, v, _ := strings.Cut(kv, "=")
		last[k] = v
	}
	require.Equal(t, "1", last["FIXED"])
	require.Equal(t, "/home/agent", last["HOME"])
	require.NotContains(t, last, "API_KEY")
	require.Equal(t, "r2", last["JETCREW_GROUP"])
}
