package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/console"
	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/roles"
)

// uiTokenEnv names the environment variable holding the console's auth
// token (docs/console.md, "Security"). It is read from the environment, not
// a flag, so it never shows in the process list.
const uiTokenEnv = "JETCREW_UI_TOKEN"

// errConsoleNeedsToken is why a console is not served: its NATS server
// requires authentication and no console token was given. The console acts
// with its connection's credentials; without a token of its own every
// local user and process could act with them, no NATS credentials needed.
var errConsoleNeedsToken = errors.New("the NATS server requires authentication, so the console needs a token of its own " +
	"(environment variable JETCREW_UI_TOKEN; every request must then carry it, or log in at /login): " +
	"without one every local user and process could act with this connection's credentials")

// consoleStartWait bounds how long serving the console waits for the run
// states to load before it answers with what it has.
const consoleStartWait = 5 * time.Second

func (a serveCmds) uiCmd() *cobra.Command {
	var url, listen string
	var readOnly bool
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the web console for any jetcrew installation",
		Long: `ui serves the web console (docs/console.md) for the jetcrew installation on
the NATS server at --nats: pools, workers, runs with their live output and
events, groups' conversations and dead letters, with cancel and replay. It
prints the console's URL on stdout as JETCREW_UI=<url> and serves until
interrupted.

It listens on loopback by default. Any other address, and any NATS server
that requires authentication, needs an auth token in the environment
variable JETCREW_UI_TOKEN: every request must then carry it (the login form,
or "Authorization: Bearer <token>"), so that nobody acts with the console's
NATS credentials without it.

--read-only serves the pages without their actions (cancel, replay, raise
budget, answer egress, send a message): for a console connected as the
observer role. Without it, an action the NATS server refuses is reported at
once, naming the role it needs.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runUI(cmd.Context(), a.natsURL(url), listen, readOnly)
		},
	}
	natsFlag(cmd, &url)
	cmd.Flags().StringVar(&listen, "listen", console.DefaultListen, "host:port the console listens on; port 0 picks a free one")
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "show no cancel, replay, raise-budget, egress or send action, and refuse them (for the observer role)")
	return cmd
}

func (a serveCmds) runUI(ctx context.Context, url, listen string, readOnly bool) error {
	l, err := a.consoleListener(listen, true)
	if err != nil {
		return err
	}
	nc, err := a.connect(url, "jetcrew ui", nats.MaxReconnects(-1))
	if err != nil {
		_ = l.Close()
		return err
	}
	defer nc.Close()
	stop, err := a.serveConsole(ctx, nc, l, a.getenv(uiTokenEnv), readOnly)
	if errors.Is(err, errConsoleNeedsToken) {
		return usageError(err)
	}
	if err != nil {
		return err
	}
	defer stop()
	<-ctx.Done()
	return nil
}

// consoleListener checks addr (console.CheckListen, with the token from
// JETCREW_UI_TOKEN) and listens on it. An address taken by another process
// is an error when the user chose it (explicit); for the default address
// it is logged and consoleListener returns a nil listener: `up` then runs
// without a console.
func (a serveCmds) consoleListener(addr string, explicit bool) (net.Listener, error) {
	if err := console.CheckListen(addr, a.getenv(uiTokenEnv)); err != nil {
		return nil, usageError(err)
	}
	l, err := net.Listen("tcp", addr)
	switch {
	case err == nil:
		return l, nil
	case !explicit && errors.Is(err, syscall.EADDRINUSE):
		a.log.Warn().Err(err).Str("listen", addr).Msg("console not served: its default address is in use (choose another with --ui)")
		return nil, nil
	}
	return nil, fmt.Errorf("console: %w", err)
}

// serveConsole serves the console on l over nc, every request needing
// token when it is not empty, prints JETCREW_UI=<url> on stdout, and
// returns the function that stops it (graceful, a few seconds at most; safe
// to call twice). A server that requires authentication needs a token
// (errConsoleNeedsToken). readOnly serves it without actions
// (console.Config.ReadOnly). l is closed by the returned function, or on
// error.
func (a serveCmds) serveConsole(ctx context.Context, nc *nats.Conn, l net.Listener, token string, readOnly bool) (func(), error) {
	if token == "" && nc.AuthRequired() {
		_ = l.Close()
		return nil, errConsoleNeedsToken
	}
	d, err := dispatcher.New(nc)
	if err != nil {
		_ = l.Close()
		return nil, err
	}
	c, err := console.New(console.Config{Dispatcher: d, Token: token, Log: a.log, ReadOnly: readOnly})
	if err != nil {
		_ = l.Close()
		return nil, err
	}
	startCtx, cancel := context.WithTimeout(ctx, consoleStartWait)
	c.Start(startCtx)
	cancel()
	// Cancelling base ends the live streams, which a graceful shutdown
	// would otherwise wait for.
	base, cancelBase := context.WithCancel(context.Background())
	srv := &http.Server{Handler: c.Handler(), ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return base }}
	done := make(chan struct{})
	go func() { // ends when srv is shut down
		defer close(done)
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error().Err(err).Msg("console stopped")
		}
	}()
	url := "http://" + l.Addr().String() + "/"
	fmt.Fprintf(a.stdout, "JETCREW_UI=%s\n", url)
	a.log.Info().Str("url", url).Msg("console ready")
	return sync.OnceFunc(func() {
		cancelBase()
		sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		_ = srv.Close()
		<-done
		c.Stop()
	}), nil
}

// upConsoleListener is consoleListener for `up --ui`: nil, without error,
// when --ui is off.
func (a serveCmds) upConsoleListener(o upOptions) (net.Listener, error) {
	if o.ui == "" || o.ui == "off" {
		return nil, nil
	}
	return a.consoleListener(o.ui, o.uiExplicit)
}

// upConsoleConn is how `up`'s console reaches the embedded server: through
// up's own connection; with --auth, through one of its own as the operator
// role (which reads everything and may cancel and replay), behind a token.
type upConsoleConn struct {
	url  string
	opts []nats.Option // the in-process options, without credentials
	keys roleKeys      // nil without --auth
	nc   *nats.Conn    // up's own connection
	// token is what every console request must carry: JETCREW_UI_TOKEN;
	// with --auth and no such variable, the one in tokenFile.
	token, tokenFile string
}

// uiTokenFile names the file under <data>/auth holding the console token
// of `up --auth` when JETCREW_UI_TOKEN is not set.
const uiTokenFile = "ui.token"

// upConsoleToken returns the token `up`'s console requires and, when it
// comes from a file, the file: JETCREW_UI_TOKEN when set; else, with --auth
// (keys) and a console to serve, the token in <data>/auth/ui.token, created
// (mode 0600) on first use and kept across restarts, like the seeds beside
// it; else none (no authentication: every local process is trusted).
func (a serveCmds) upConsoleToken(keys roleKeys, serve bool, dataDir string) (token, file string, err error) {
	if t := a.getenv(uiTokenEnv); t != "" || keys == nil || !serve {
		return t, "", nil
	}
	file = filepath.Join(dataDir, authDirName, uiTokenFile)
	token, err = loadOrCreateToken(file)
	return token, file, err
}

// operatorAuth is what `up --auth`'s console connects with: the operator
// role's seed and inbox prefix.
func operatorAuth(keys roleKeys) ([]nats.Option, error) {
	opt, err := nats.NkeyOptionFromSeed(keys[roles.Operator])
	if err != nil {
		return nil, err
	}
	return []nats.Option{opt, nats.CustomInboxPrefix(roles.InboxPrefix(roles.Operator))}, nil
}

// upConsole serves the console of `up` on l, once its worker is ready, and
// returns the function that stops it (safe to call twice). With a nil l, or
// when the console cannot start (logged), it serves nothing.
func (a serveCmds) upConsole(ctx context.Context, cc upConsoleConn, l net.Listener) func() {
	if l == nil {
		return func() {}
	}
	nc, closeNC := cc.nc, func() {}
	if cc.keys != nil {
		auth, err := operatorAuth(cc.keys)
		if err == nil {
			nc, err = a.dial(cc.url, "jetcrew up console", append(slices.Clone(cc.opts), auth...)...)
		}
		if err != nil {
			_ = l.Close()
			a.log.Error().Err(err).Msg("console not served")
			return func() {}
		}
		closeNC = nc.Close
	}
	stop, err := a.serveConsole(ctx, nc, l, cc.token, false)
	if err != nil {
		closeNC()
		a.log.Error().Err(err).Msg("console not served")
		return func() {}
	}
	if cc.tokenFile != "" {
		fmt.Fprintf(a.stdout, "JETCREW_UI_TOKEN_FILE=%s\n", cc.tokenFile)
	}
	return sync.OnceFunc(func() {
		stop()
		closeNC()
	})
}
