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
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestBuildSpecShellGolden(t *testing.T) {
	t.Parallel()
	plan, err := planAgent(ShellProfile(), "echo hi", false)
	require.NoError(t, err)
	spec, err := BuildSpec(SpecInput{
		Plan:    plan,
		Profile: ShellProfile(),
		Request: messages.RunRequest{ID: "r1", Profile: "shell", Prompt: "echo hi", Group: "g",
			Env: map[string]string{"B": "2", "A": "1"}}.WithDefaults(),
		Attempt:   2,
		WorkerID:  "w1",
		Now:       time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC),
		LookupEnv: func(string) (string, bool) { return "", false },
	})
	require.NoError(t, err)
	got, err := json.MarshalIndent(spec, "", "  ")
	require.NoError(t, err)
	path := filepath.Join("testdata", "spec-shell.json")
	if *update {
		require.NoError(t, os.WriteFile(path, append(got, '\n'), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got)+"\n")
}

func TestBuildSpecJail(t *testing.T) {
	t.Parallel()
	secret := "sk-very-secret"
	p := ShellProfile()
	p.EnvFromHost = []string{"API_KEY"}
	p.Env = map[string]string{"FIXED": "1"}
	plan, err := planAgent(p, "x", false)
	require.NoError(t, err)
	spec, err := BuildSpec(SpecInput{
		Plan:    plan,
		Profile: p,
		// The request tries to override jetcrew's own and the profile's variables.
		Request:   messages.RunRequest{ID: "r2", Profile: "shell", Prompt: "x", Env: map[string]string{"FIXED": "0", "HOME": "/"}},
		Attempt:   1,
		WorkerID:  "w",
		Now:       time.Now(),
		LookupEnv: func(k string) (string, bool) { return secret, k == "API_KEY" },
	})
	require.NoError(t, err)
	require.Equal(t, "jetcrew-r2-0-1", spec.Name)
	require.Equal(t, "65532:65532", spec.User)
	require.Equal(t, "none", spec.Network)
	require.Equal(t, int64(512<<20), spec.MemoryBytes)
	require.Equal(t, int64(1e9), spec.NanoCPUs)
	require.Equal(t, int64(256), spec.PidsLimit)
	require.Equal(t, "size=64m,mode=1777", spec.Tmpfs["/tmp"])
	require.Equal(t, "size=64m,mode=0700,uid=65532,gid=65532", spec.Tmpfs["/home/agent"])
	require.Equal(t, []string{"/bin/sh", "-c", "x"}, spec.Cmd)
	// Docker takes the last of repeated variables: the profile's and
	// jetcrew's own come after the request's.
	last := map[string]string{}
	for _, kv := range spec.Env {
		k, v, _ := strings.Cut(kv, "=")
		last[k] = v
	}
	require.Equal(t, "1", last["FIXED"])
	require.Equal(t, "/home/agent", last["HOME"])
	require.Equal(t, secret, last["API_KEY"])
	require.Equal(t, "r2", last["JETCREW_GROUP"])

	_, err = BuildSpec(SpecInput{Profile: p, Request: messages.RunRequest{ID: "r3", Profile: "shell"},
		Attempt: 1, Now: time.Now(), LookupEnv: func(string) (string, bool) { return "", false }})
	require.ErrorContains(t, err, "env_from_host API_KEY is not set")
}

func TestParseProfiles(t *testing.T) {
	t.Parallel()
	ps, err := ParseProfiles("test.toml", []byte(`
[profiles.big]
image = "jetcrew-sandbox:latest"
command = ["/bin/sh", "-c", "{prompt}"]
memory_mib = 2048
cpus = 1.5
network = "bridge"
timeout = "10m"
env = { MODE = "ci" }
env_from_host = ["ANTHROPIC_API_KEY"]
`))
	require.NoError(t, err)
	require.Equal(t, []string{"big", "shell"}, ps.Names())
	big := ps["big"]
	require.Equal(t, int64(2048), big.MemoryMiB)
	require.Equal(t, 1.5, big.CPUs)
	require.Equal(t, "bridge", big.Network)
	require.Equal(t, 10*time.Minute, big.timeout)
	require.Equal(t, DefaultUser, big.User)
	require.Equal(t, "/home/agent", big.WorkDir)

	bad := map[string]string{
		"unknown key":   "[profiles.x]\nimage='i'\ncommand=['a']\nmounts=['/']\n",
		"root user":     "[profiles.x]\nimage='i'\ncommand=['a']\nuser='0:0'\n",
		"named user":    "[profiles.x]\nimage='i'\ncommand=['a']\nuser='root'\n",
		"host network":  "[profiles.x]\nimage='i'\ncommand=['a']\nnetwork='host'\n",
		"no image":      "[profiles.x]\ncommand=['a']\n",
		"no command":    "[profiles.x]\nimage='i'\n",
		"bad name":      "[profiles.'a.b']\nimage='i'\ncommand=['a']\n",
		"home in tmp":   "[profiles.x]\nimage='i'\ncommand=['a']\nhome='/tmp/h'\n",
		"bad runtime":   "[profiles.x]\nimage='i'\ncommand=['a']\nruntime='run sc'\n",
		"bad timeout":   "[profiles.x]\nimage='i'\ncommand=['a']\ntimeout='soon'\n",
		"tiny memory":   "[profiles.x]\nimage='i'\ncommand=['a']\nmemory_mib=1\n",
		"bad backend":   "[profiles.x]\nbackend='magic'\nimage='i'\ncommand=['a']\n",
		"bad env name":  "[profiles.x]\nimage='i'\ncommand=['a']\nenv_from_host=['A-B']\n",
		"not toml":      "[profiles.x\n",
		"container net": "[profiles.x]\nimage='i'\ncommand=['a']\nnetwork='container:abc'\n",
	}
	for name, doc := range bad {
		_, err := ParseProfiles("bad.toml", []byte(doc))
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "bad.toml", name)
	}
}
