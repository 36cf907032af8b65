package profile

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

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
	require.Equal(t, 10*time.Minute, big.TimeoutDuration())
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
