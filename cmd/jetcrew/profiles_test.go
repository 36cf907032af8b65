package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestProfilesCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	require.NoError(t, os.WriteFile(good, []byte("[profiles.codex]\nbackend='codex'\nimage='jetcrew-codex:latest'\nenv_from_host=['OPENAI_API_KEY']\n"), 0o644))
	code, out, _ := cli(t, "", "profiles", "check", good)
	require.Equal(t, 0, code)
	require.Contains(t, out, "# profile codex")
	require.Contains(t, out, `"CODEX_HOME=/home/agent/.codex"`)
	require.Contains(t, out, "/run/jetcrew/home/.codex/config.toml (0444)")
	require.Contains(t, out, "# profile shell")

	bad := filepath.Join(dir, "bad.toml")
	require.NoError(t, os.WriteFile(bad, []byte("[profiles.x]\nimage='i'\ncommand=['a']\nuser='0:0'\n"), 0o644))
	code, _, errOut := cli(t, "", "profiles", "check", bad)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "never run as root")
}

// The profile reference's example is a valid profile file.
func TestProfilesDocExample(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/profiles.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(doc), "```toml\n")
	require.True(t, ok)
	example, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	path := filepath.Join(t.TempDir(), "example.toml")
	require.NoError(t, os.WriteFile(path, []byte(example), 0o644))
	code, out, errOut := cli(t, "", "profiles", "check", path)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "# profile shell-net")
}
