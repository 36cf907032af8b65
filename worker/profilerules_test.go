package worker_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/profile"
)

const baseProfile = "[profiles.p]\nimage = \"i\"\ncommand = [\"/bin/sh\", \"-c\", \"{prompt}\"]\n"

// The profile loader refuses, naming file, profile and key, what it once
// accepted: inexact or duplicate keys (item 4), the worker's own
// connection variables, homes outside HomePrefixes and out-of-range ids
// (item 13), and loader/runtime/proxy variables in request_env (item 7).
func TestProfileLoaderRefusesUnsafeValues(t *testing.T) {
	t.Parallel()
	bad := map[string]string{
		"Image = \"evil\"\n":                  `key "Image" is not a profile key`,
		"IMAGE = \"evil\"\n":                  `key "IMAGE" is not a profile key`,
		"image = \"evil\"\n":                  "already been defined",
		"env_from_host = [\"NATS_URL\"]\n":    `env_from_host "NATS_URL" is one of the worker's own connection variables`,
		"env_from_host = [\"nats_creds\"]\n":  `env_from_host "nats_creds"`,
		"env_from_host = [\"DOCKER_HOST\"]\n": `env_from_host "DOCKER_HOST"`,
		"home = \"/etc\"\n":                   `home "/etc" must be at or under one of /home, /work, /workspace`,
		"home = \"/home/../etc\"\n":           `home "/home/../etc"`,
		"home = \"/homeless\"\n":              `home "/homeless"`,
		"workdir = \"/usr/bin\"\n":            `workdir "/usr/bin"`,
		"user = \"4294967296:1000\"\n":        "uid and gid must be 1 to 2147483647",
		"user = \"1000:2147483648\"\n":        "uid and gid must be 1 to 2147483647",
		"request_env = [\"LD_PRELOAD\"]\n":    `request_env "LD_PRELOAD" is a loader, runtime, proxy or worker variable`,
		"request_env = [\"https_proxy\"]\n":   `request_env "https_proxy"`,
		"request_env = [\"NODE_OPTIONS\"]\n":  `request_env "NODE_OPTIONS"`,
		"request_env = [\"PATH\"]\n":          `request_env "PATH"`,
		"request_env = [\"A-B\"]\n":           `request_env "A-B" is neither`,
	}
	for extra, want := range bad {
		_, err := profile.ParseProfiles("bad.toml", []byte(baseProfile+extra))
		require.ErrorContains(t, err, want, extra)
		require.ErrorContains(t, err, "bad.toml", extra)
	}
	_, err := profile.ParseProfiles("bad.toml", []byte("[Profiles.p]\nimage = \"i\"\ncommand = [\"x\"]\n"))
	require.ErrorContains(t, err, `key "Profiles" is not "profiles"`)

	ps, err := profile.ParseProfiles("ok.toml", []byte(baseProfile+"home = \"/workspace/agent\"\nuser = \"2147483647:1000\"\nrequest_env = [\"GREETING\", \"APP_*\"]\nenv = { path = \"x\" }\n"))
	require.NoError(t, err)
	require.Equal(t, []string{"GREETING", "APP_*"}, ps["p"].RequestEnv)
	require.Equal(t, []string{"*"}, profile.ShellProfile().RequestEnv)
}

// A request's env reaches the run only through its profile's request_env,
// and loader, runtime and proxy variables never do (item 7). A prompt with a
// NUL byte that a profile would put in argv is refused before anything is
// staged, naming the byte; stdin carries it (item 20).
func TestRequestEnvAllowlistAndNULPrompt(t *testing.T) {
	t.Parallel()
	ps, err := profile.ParseProfiles("p.toml", []byte(`
[profiles.strict]
image = "jetcrew-sandbox:latest"
command = ["/bin/sh", "-c", "{prompt}"]
coordination = false
[profiles.some]
image = "jetcrew-sandbox:latest"
command = ["/bin/sh", "-c", "{prompt}"]
coordination = false
request_env = ["GREETING", "APP_*", "*"]
[profiles.stdin]
image = "jetcrew-sandbox:latest"
command = ["/bin/sh"]
prompt_stdin = true
coordination = false
`))
	require.NoError(t, err)
	b := setup(t, func(c *worker.Config) { c.Profiles = ps })
	cases := []struct {
		req    messages.RunRequest
		reason string // "" means it succeeds
	}{
		{messages.RunRequest{ID: "env1", Profile: "strict", Prompt: "out x", Env: map[string]string{"GREETING": "hi"}}, `profile "strict" accepts no variables`},
		{messages.RunRequest{ID: "env2", Profile: "some", Prompt: "out x", Env: map[string]string{"GREETING": "hi", "APP_X": "1"}}, ""},
		{messages.RunRequest{ID: "env3", Profile: "some", Prompt: "out x", Env: map[string]string{"LD_PRELOAD": "/tmp/x.so"}}, "request env LD_PRELOAD is refused: loader"},
		{messages.RunRequest{ID: "env4", Profile: "some", Prompt: "out x", Env: map[string]string{"https_proxy": "http://evil"}}, "request env https_proxy is refused"},
		{messages.RunRequest{ID: "env5", Profile: "shell", Prompt: "out x", Env: map[string]string{"NODE_OPTIONS": "--require x"}}, "request env NODE_OPTIONS is refused"},
		{messages.RunRequest{ID: "env6", Profile: "shell", Prompt: "out x", Env: map[string]string{"PATH": "/tmp"}}, "request env PATH is refused"},
		{messages.RunRequest{ID: "nul1", Profile: "shell", Prompt: "echo a\x00b"}, "prompt has a NUL byte at byte 6"},
		{messages.RunRequest{ID: "nul2", Profile: "stdin", Prompt: "out a\x00b"}, ""},
	}
	for _, c := range cases {
		b.submit(t, c.req)
	}
	for _, c := range cases {
		st := b.waitFinal(t, c.req.ID)
		if c.reason == "" {
			require.Equal(t, messages.StateSucceeded, st.State, "%s: %s", c.req.ID, st.Reason)
			continue
		}
		require.Equal(t, messages.StateFailed, st.State, c.req.ID)
		require.Contains(t, st.Reason, c.reason, c.req.ID)
	}
	require.Len(t, b.rt.Starts(), 2, "only the accepted requests started a container")
}
