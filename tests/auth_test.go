package tests

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/roles"
)

// The end-to-end tests run against `jetcrew up`, and the main-path and
// coordination ones both without and with `--auth`. With --auth every
// command acts as a role, through the NATS CLI context `up --auth` wrote:
// jetcrew submit, status, watch, result, diff, apply and artifacts as the
// submitter, everything else (the
// stock NATS CLI, cancel, failed, replay) as the operator.

// authSetup is where an auth-enabled `jetcrew up` keeps its contexts (the
// NATS CLI configuration directory given to it) and its seeds.
type authSetup struct{ xdg, data string }

// authSetups maps the URL of each auth-enabled `jetcrew up` to its setup.
var authSetups sync.Map

// authModes are the two ways the main-path and coordination tests run.
var authModes = []struct {
	name string
	args []string
}{{"no-auth", nil}, {"auth", []string{"--auth"}}}

// upAuthEnv returns the environment additions of an `up` started with args:
// with --auth, a NATS CLI configuration directory of its own.
func upAuthEnv(t *testing.T, args []string) (authSetup, []string) {
	if !slices.Contains(args, "--auth") {
		return authSetup{}, nil
	}
	s := authSetup{xdg: t.TempDir()}
	return s, []string{"XDG_CONFIG_HOME=" + s.xdg}
}

// roleFor is the role a command acts as on an auth-enabled server.
func roleFor(bin string, args []string) string {
	if bin == jetcrewBin && len(args) > 0 && slices.Contains([]string{"submit", "status", "watch", "result", "diff", "apply", "artifacts"}, args[0]) {
		return "submitter"
	}
	return "operator"
}

// authEnv returns the environment that makes a command act as role on the
// server at url: nothing for a server without authentication.
func authEnv(url, role string) []string {
	v, ok := authSetups.Load(url)
	if !ok {
		return nil
	}
	s := v.(authSetup)
	return []string{"XDG_CONFIG_HOME=" + s.xdg, "NATS_CONTEXT=jetcrew-" + role}
}

// natsConnect connects the test itself to url, as the operator when the
// server wants credentials.
func natsConnect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	var opts []nats.Option
	if v, ok := authSetups.Load(url); ok {
		opt, err := nats.NkeyOptionFromSeed(filepath.Join(v.(authSetup).data, "auth", "operator.nk"))
		require.NoError(t, err)
		// The operator role's replies arrive under its own prefix only.
		opts = append(opts, opt, nats.CustomInboxPrefix(roles.InboxPrefix(roles.Operator)))
	}
	nc, err := nats.Connect(url, opts...)
	require.NoError(t, err)
	return nc
}

// requireSeedsPrivate checks the seeds an auth-enabled up wrote.
func requireSeedsPrivate(t *testing.T, url string) {
	t.Helper()
	v, ok := authSetups.Load(url)
	require.True(t, ok)
	for _, role := range []string{"submitter", "worker", "operator", "observer"} {
		st, err := os.Stat(filepath.Join(v.(authSetup).data, "auth", role+".nk"))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	}
}
