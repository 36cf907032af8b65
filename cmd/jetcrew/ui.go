package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
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

// consoleStartWait bounds how long serving the console waits for the run
// states to load before it answers with what it has.
const consoleStartWait = 5 * time.Second

func (a *app) uiCmd() *cobra.Command {
	var url, listen string
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the web console for any jetcrew installation",
		Long: `ui serves the web console (docs/console.md) for the jetcrew installation on
the NATS server at --nats: pools, workers, runs with their live output and
events, groups' conversations and dead letters, with cancel and replay. It
prints the console's URL on stdout as JETCREW_UI=<url> and serves until
interrupted.

It listens on loopback by default. Any other address needs an auth token in
the environment variable JETCREW_UI_TOKEN: every request must then carry it
(the login form, or "Authorization: Bearer <token>").`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runUI(cmd.Context(), a.natsURL(url), listen)
		},
	}
	natsFlag(cmd, &url)
	cmd.Flags().StringVar(&listen, "listen", console.DefaultListen, "host:port the console listens on; port 0 picks a free one")
	return cmd
}

func (a *app) runUI(ctx context.Context, url, listen string) error {
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
	stop, err := a.serveConsole(ctx, nc, l)
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
func (a *app) consoleListener(addr string, explicit bool) (net.Listener, error) {
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

// serveConsole serves the console on l over nc, prints JETCREW_UI=<url> on
// stdout, and returns the function that stops it (graceful, a few seconds
// at most; safe to call twice). l is closed by the returned function, or on error.
func (a *app) serveConsole(ctx context.Context, nc *nats.Conn, l net.Listener) (func(), error) {
	d, err := dispatcher.New(nc)
	if err != nil {
		_ = l.Close()
		return nil, err
	}
	c, err := console.New(console.Config{Dispatcher: d, Token: a.getenv(uiTokenEnv), Log: a.log})
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
func (a *app) upConsoleListener(o upOptions) (net.Listener, error) {
	if o.ui == "" || o.ui == "off" {
		return nil, nil
	}
	return a.consoleListener(o.ui, o.uiExplicit)
}

// upConsoleConn is how `up`'s console reaches the embedded server: through
// up's own connection; with --auth, through one of its own as the operator
// role (which reads everything and may cancel and replay).
type upConsoleConn struct {
	url  string
	opts []nats.Option // the in-process options, without credentials
	keys roleKeys      // nil without --auth
	nc   *nats.Conn    // up's own connection
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
func (a *app) upConsole(ctx context.Context, cc upConsoleConn, l net.Listener) func() {
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
	stop, err := a.serveConsole(ctx, nc, l)
	if err != nil {
		closeNC()
		a.log.Error().Err(err).Msg("console not served")
		return func() {}
	}
	return sync.OnceFunc(func() {
		stop()
		closeNC()
	})
}
