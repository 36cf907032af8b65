package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/nats-io/jsm.go/natscontext"
	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
)

// connOptions are the NATS CLI's connection options (natscli v0.5.0's global
// flags, with the same names and environment variables), shared by every
// command that connects. The server URL stays each command's --nats flag
// (NATS_URL).
type connOptions struct {
	context  string // --context, NATS_CONTEXT: a context name or a .json file
	creds    string // --creds, NATS_CREDS
	nkey     string // --nkey, NATS_NKEY: a file holding an NKey seed
	user     string // --user, NATS_USER (alone: a token, as the NATS CLI)
	password string // --password, NATS_PASSWORD
	token    string // --token, NATS_TOKEN
	tlsCert  string // --tlscert, NATS_CERT
	tlsKey   string // --tlskey, NATS_KEY
	tlsCA    string // --tlsca, NATS_CA
	inbox    string // --inbox-prefix (no variable, as the NATS CLI)
}

// connEnv maps each option to its environment variable, as the NATS CLI
// reads them.
func (o *connOptions) connEnv() map[*string]string {
	return map[*string]string{
		&o.context: "NATS_CONTEXT", &o.creds: "NATS_CREDS", &o.nkey: "NATS_NKEY",
		&o.user: "NATS_USER", &o.password: "NATS_PASSWORD", &o.token: "NATS_TOKEN",
		&o.tlsCert: "NATS_CERT", &o.tlsKey: "NATS_KEY", &o.tlsCA: "NATS_CA",
	}
}

// addConnFlags adds the connection options to fs (the root command's
// persistent flags, so every command has them).
func (a *app) addConnFlags(fs *pflag.FlagSet) {
	o := &a.conn
	fs.StringVar(&o.context, "context", "", "NATS CLI context: a name (as 'nats context save' writes) or a .json file (default $NATS_CONTEXT, else the selected context)")
	fs.StringVar(&o.creds, "creds", "", "NATS user credentials file (default $NATS_CREDS)")
	fs.StringVar(&o.nkey, "nkey", "", "file holding a NATS user NKey seed (default $NATS_NKEY)")
	fs.StringVar(&o.user, "user", "", "NATS user name, or a token without --password (default $NATS_USER)")
	fs.StringVar(&o.password, "password", "", "NATS password (default $NATS_PASSWORD)")
	fs.StringVar(&o.token, "token", "", "NATS token (default $NATS_TOKEN)")
	fs.StringVar(&o.tlsCert, "tlscert", "", "TLS client certificate file (default $NATS_CERT); for up, the server's certificate")
	fs.StringVar(&o.tlsKey, "tlskey", "", "TLS client private key file (default $NATS_KEY); for up, the server's key")
	fs.StringVar(&o.tlsCA, "tlsca", "", "TLS certificate authority file to verify the server with (default $NATS_CA)")
	fs.StringVar(&o.inbox, "inbox-prefix", "", "inbox prefix for request replies, e.g. _INBOX_jetcrew_submitter for jetcrew's roles (default: the context's, else _INBOX)")
}

// resolvedConn returns the connection options with every option not given
// as a flag taken from its environment variable.
func (a *app) resolvedConn() connOptions {
	o := a.conn
	for p, env := range o.connEnv() {
		if *p == "" {
			*p = a.getenv(env)
		}
	}
	return o
}

// contextRoot is the directory the NATS CLI keeps its configuration under
// (contexts in <root>/nats/context), resolved as the NATS CLI resolves it
// (package natscontext): $XDG_CONFIG_HOME, else .config in the home
// directory of the user the process runs as, from the password database,
// never $HOME (sudo, CI and containers often point HOME elsewhere, where
// the NATS CLI would not look). XDG_CONFIG_HOME is read through a.getenv
// and the rest through a.natsConfigRoot, so tests choose both.
func (a *app) contextRoot() (string, error) {
	if x := a.getenv("XDG_CONFIG_HOME"); x != "" {
		return x, nil
	}
	root, err := a.natsConfigRoot()
	if err != nil {
		return "", fmt.Errorf("the NATS CLI's configuration directory (XDG_CONFIG_HOME is not set): %w", err)
	}
	return root, nil
}

// natsCLIConfigRoot is the NATS CLI's own answer to where its configuration
// lives: the root natscontext.ContextPath puts a context under
// (<root>/nats/context/<name>.json). It reads XDG_CONFIG_HOME from the
// process's environment, then the password database.
func natsCLIConfigRoot() (string, error) {
	p, err := natscontext.ContextPath(contextPrefix + "probe")
	if err != nil {
		return "", err
	}
	return filepath.Dir(filepath.Dir(filepath.Dir(p))), nil
}

// natsContext loads the NATS CLI context the options name (or the selected
// one when they name none; an empty context when none is selected) and
// applies the options and url over it, exactly as the NATS CLI does: a flag
// or variable given wins over the context's setting.
func (a *app) natsContext(url string) (*natscontext.Context, error) {
	o := a.resolvedConn()
	opts := []natscontext.Option{
		natscontext.WithServerURL(url),
		natscontext.WithCreds(o.creds),
		natscontext.WithNKey(o.nkey),
		natscontext.WithCertificate(o.tlsCert),
		natscontext.WithKey(o.tlsKey),
		natscontext.WithCA(o.tlsCA),
		natscontext.WithToken(o.token),
		natscontext.WithInboxPrefix(o.inbox),
	}
	if o.user != "" && o.password == "" {
		opts = append(opts, natscontext.WithToken(o.user))
	} else {
		opts = append(opts, natscontext.WithUser(o.user), natscontext.WithPassword(o.password))
	}
	if strings.HasSuffix(o.context, ".json") {
		backend := natscontext.NewSingleFileBackend(o.context)
		c, err := natscontext.NewRegistry(backend).Load(context.Background(), backend.Name(), opts...)
		if err != nil {
			return nil, fmt.Errorf("NATS context file %s: %w", o.context, err)
		}
		return c, nil
	}
	root, err := a.contextRoot()
	if err != nil {
		if o.context != "" {
			return nil, fmt.Errorf("NATS context %q: no stored contexts: %w", o.context, err)
		}
		return natscontext.New("", false, opts...)
	}
	c, err := natscontext.NewRegistry(natscontext.NewFileBackendAt(root)).Load(context.Background(), o.context, opts...)
	if err != nil {
		return nil, fmt.Errorf("NATS context %q (under %s): %w", o.context, filepath.Join(root, "nats", "context"), err)
	}
	return c, nil
}

// natsOptions returns the server URL(s) and the client options the
// connection options (and the context) give, for url (the --nats flag or
// NATS_URL; empty means the context's, else defaultNATSURL).
func (a *app) natsOptions(url string) (string, []nats.Option, error) {
	c, err := a.natsContext(url)
	if err != nil {
		return "", nil, usageError(err)
	}
	opts, err := c.NATSOptions()
	if err != nil {
		return "", nil, usageError(fmt.Errorf("NATS connection options: %w", err))
	}
	if url == "" {
		url = c.ServerURL()
	}
	return url, opts, nil
}
