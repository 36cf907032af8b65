package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
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
