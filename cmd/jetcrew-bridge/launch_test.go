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

// The launcher sets the env file's variables over the container's own,
// never over HOME nor a JETCREW_ variable the container has, and passes
// the rest through.
func TestLaunchEnvFile(t *testing.T) {
	t.Parallel()
	bin, err := buildBridge()
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "launch-env.json")
	require.NoError(t, os.WriteFile(file, []byte(`["API_KEY=sk-live=1","PLAIN=from-file","HOME=/evil","JETCREW_RUN_ID=other","JETCREW_TEST_SECRET=s3","not a var","TOKEN=multi\nline"]`), 0o444))
	cmd := exec.Command(bin, "launch", "--env-file", file, "--", "env")
	cmd.Env = []string{"HOME=/home/agent", "PATH=/usr/bin:/bin", "PLAIN=from-container", "JETCREW_RUN_ID=r1", "KEEP=1"}
	out, err := cmd.Output()
	require.NoError(t, err)
	env := map[string]string{}
	for _, kv := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	require.Equal(t, "sk-live=1", env["API_KEY"])
	require.Equal(t, "from-file", env["PLAIN"], "the file wins over the container's environment")
	require.Equal(t, "/home/agent", env["HOME"], "HOME is the worker's")
	require.Equal(t, "r1", env["JETCREW_RUN_ID"], "JETCREW_ variables the container has are the worker's")
	require.Equal(t, "s3", env["JETCREW_TEST_SECRET"], "a JETCREW_ name the worker does not set passes")
	require.Equal(t, "1", env["KEEP"])
	require.Equal(t, "multi", env["TOKEN"], "a value may hold a newline")

	require.NoError(t, os.WriteFile(file, []byte(`{"not":"an array"}`), 0o444))
	cmd = exec.Command(bin, "launch", "--env-file", file, "--", "true")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.Error(t, cmd.Run())
	require.Contains(t, stderr.String(), "is not a JSON array of strings")
	require.NotContains(t, stderr.String(), "an array", "the file's content is never echoed")
}
