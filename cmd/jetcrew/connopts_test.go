package main

import (
	"os"
	"os/user"
	"path/filepath"
	"testing"

	"github.com/nats-io/jsm.go/natscontext"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/roles"
)

// The connection options follow the NATS CLI: a flag wins over its
// variable, both over the context; a user alone is a token.
func TestConnOptionsPrecedence(t *testing.T) {
	t.Parallel()
	xdg := t.TempDir()
	dir := filepath.Join(xdg, "nats", "context")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prod.json"),
		[]byte(`{"url":"nats://ctx:4222","user":"ctxuser","password":"ctxpw","ca":"/ctx/ca.pem"}`), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(xdg, "nats", "context.txt"), []byte("prod"), 0o600))

	tests := []struct {
		name               string
		env                map[string]string
		flags              []string
		url, user, ca, tok string
	}{
		{"selected context", nil, nil, "nats://ctx:4222", "ctxuser", "/ctx/ca.pem", ""},
		{"variables over the context", map[string]string{"NATS_USER": "envuser", "NATS_PASSWORD": "pw", "NATS_CA": "/env/ca.pem", "NATS_URL": "nats://env:4222"}, nil,
			"nats://env:4222", "envuser", "/env/ca.pem", ""},
		{"flags over variables", map[string]string{"NATS_USER": "envuser", "NATS_PASSWORD": "pw"}, []string{"--user", "flaguser", "--password", "x", "--nats", "nats://flag:4222"},
			"nats://flag:4222", "flaguser", "/ctx/ca.pem", ""},
		{"a user alone is a token", nil, []string{"--user", "s3cret"}, "nats://ctx:4222", "ctxuser", "/ctx/ca.pem", "s3cret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"XDG_CONFIG_HOME": xdg}
			for k, v := range tt.env {
				env[k] = v
			}
			a := newTestApp(env, nil)
			root := a.rootCmd()
			var url string
			natsFlag(root, &url)
			require.NoError(t, root.ParseFlags(tt.flags))
			c, err := a.natsContext(a.natsURL(url))
			require.NoError(t, err)
			require.Equal(t, tt.url, c.ServerURL())
			require.Equal(t, tt.user, c.User())
			require.Equal(t, tt.ca, c.CA())
			require.Equal(t, tt.tok, c.Token())
		})
	}
}

// Without a configuration directory there are no stored contexts: the
// defaults apply, and naming a context is an error.
func TestConnOptionsNoConfigDir(t *testing.T) {
	t.Parallel()
	a := newTestApp(nil, nil)
	c, err := a.natsContext("")
	require.NoError(t, err)
	require.Equal(t, defaultNATSURL, c.ServerURL())
	a = newTestApp(map[string]string{"NATS_CONTEXT": "prod"}, nil)
	_, err = a.natsContext("")
	require.ErrorContains(t, err, "no stored contexts")
}

// Jetcrew reads and `up --auth` writes contexts where the
// NATS CLI (natscontext) looks: $XDG_CONFIG_HOME, else .config in the home
// directory the password database gives, never $HOME (which sudo, CI and
// containers point elsewhere).
func TestContextRootLikeNATSCLI(t *testing.T) {
	t.Parallel()
	elsewhere := t.TempDir()
	a := newTestApp(map[string]string{"HOME": elsewhere}, nil)
	a.natsConfigRoot = newApp().natsConfigRoot
	root, err := a.contextRoot()
	require.NoError(t, err)
	require.NotEqual(t, filepath.Join(elsewhere, ".config"), root, "$HOME is not where the NATS CLI looks")
	want := os.Getenv("XDG_CONFIG_HOME")
	if want == "" {
		u, err := user.Current()
		require.NoError(t, err)
		want = filepath.Join(u.HomeDir, ".config")
	}
	require.Equal(t, want, root)
	p, err := natscontext.ContextPath("jetcrew-submitter")
	require.NoError(t, err)
	require.Equal(t, p, natscontext.NewFileBackendAt(root).Path("jetcrew-submitter"), "the path the NATS CLI reads")

	xdg := t.TempDir()
	a = newTestApp(map[string]string{"HOME": elsewhere, "XDG_CONFIG_HOME": xdg}, nil)
	root, err = a.contextRoot()
	require.NoError(t, err)
	require.Equal(t, xdg, root)
}

// `up --auth` prints each context's file beside its name and seed, and the
// NATS CLI's own registry finds it there.
func TestUpAuthPrintsContextFiles(t *testing.T) {
	t.Parallel()
	xdg := t.TempDir()
	a := newTestApp(map[string]string{"XDG_CONFIG_HOME": xdg}, nil)
	keys, _, err := ensureRoleKeys(filepath.Join(t.TempDir(), authDirName))
	require.NoError(t, err)
	require.NoError(t, serveCmds{a.app}.announceAuth("nats://127.0.0.1:4222", keys))
	file := filepath.Join(xdg, "nats", "context", "jetcrew-submitter.json")
	require.Contains(t, a.stdout.String(), "NATS_CONTEXT_SUBMITTER=jetcrew-submitter\t# context "+file+", seed "+keys[roles.Submitter]+"\n")
	c, err := natscontext.NewRegistry(natscontext.NewFileBackendAt(xdg)).Load(t.Context(), "jetcrew-submitter")
	require.NoError(t, err)
	require.Equal(t, keys[roles.Submitter], c.NKey())
}
