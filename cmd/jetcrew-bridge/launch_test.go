package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The launcher seeds $HOME from the staged directory, connects the prompt
// file to stdin and execs the agent.
func TestLaunch(t *testing.T) {
	t.Parallel()
	bin, err := buildBridge()
	require.NoError(t, err)
	seed, home := t.TempDir(), t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(seed, ".codex"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(seed, ".codex", "config.toml"), []byte("[mcp_servers.jetcrew]\n"), 0o444))
	prompt := filepath.Join(t.TempDir(), "prompt")
	long := strings.Repeat("a long prompt ", 20000) // 280 KB: more than one argument may hold
	require.NoError(t, os.WriteFile(prompt, []byte(long), 0o444))

	cmd := exec.Command(bin, "launch", "--home-seed", seed, "--stdin", prompt, "--", "cat")
	cmd.Env = []string{"HOME=" + home, "PATH=/usr/bin:/bin"}
	out, err := cmd.Output()
	require.NoError(t, err)
	require.Equal(t, long, string(out))
	fi, err := os.Stat(filepath.Join(home, ".codex", "config.toml"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "seeded copies are writable by the agent")

	cmd = exec.Command(bin, "launch", "--", "/nonexistent/agent")
	err = cmd.Run()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 127, ee.ExitCode())
}

// `jetcrew bridge ...` is the same entry point as the binary started under
// the name "bridge".
func TestJetcrewBridgeSubcommand(t *testing.T) {
	t.Parallel()
	bin, err := buildBridge()
	require.NoError(t, err)
	jetcrew := filepath.Join(t.TempDir(), "jetcrew")
	require.NoError(t, os.Symlink(bin, jetcrew))
	cmd := exec.Command(jetcrew, "bridge", "launch", "--", "echo", "hi")
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.Output()
	require.NoError(t, err)
	require.Equal(t, "hi\n", string(out))
	var stderr strings.Builder
	cmd = exec.Command(jetcrew, "bridge", "--help")
	cmd.Stderr = &stderr
	out, _ = cmd.Output()
	require.Equal(t, 2, cmd.ProcessState.ExitCode())
	require.Empty(t, out, "stdout belongs to JSON-RPC frames alone")
	require.Contains(t, stderr.String(), "takes no arguments")
}
