package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/console"
	"github.com/jetcrew/jetcrew/roles"
	"github.com/jetcrew/jetcrew/worker"
)

// serverReadyTimeout bounds the embedded server's start; serverReadyStep
// is how long one readiness check waits before the fatal errors the server
// logged are looked at again.
const (
	serverReadyTimeout = 10 * time.Second
	serverReadyStep    = 50 * time.Millisecond
)

type upOptions struct {
	listen  string
	dataDir string
	// storeMiB is --store-max-mib: the embedded server's JetStream store
	// limit on disk.
	storeMiB int64
	auth     bool   // --auth: one NKey user per role (upauth.go)
	ui       string // --ui: the console's address; "" or "off" serves none
	// uiExplicit: --ui was given, so an address in use is an error.
	uiExplicit bool
	worker     workerOptions
}

func (a serveCmds) upCmd() *cobra.Command {
	var o upOptions
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run an embedded NATS server with JetStream and a worker, in the foreground",
		Long: `up starts, in one foreground process, an embedded NATS server with JetStream
(file storage under --data) and a worker that takes runs from it and runs them
in Docker containers. Once both are ready it prints the server's URL on stdout
as NATS_URL=<url>, for other jetcrew commands and NATS clients, then the web
console's (--ui, default 127.0.0.1:4280; docs/console.md) as JETCREW_UI=<url>.

SIGUSR2 stops it for an upgrade: its runs in flight go on in their containers,
and the next worker started on the same engine adopts them, their agents never
restarted. Interrupt (Ctrl-C) or SIGTERM stops it: runs in flight get --drain-timeout to
finish (a second interrupt cuts that short), then the server shuts down.

By default the server has no authentication, and --listen must then be a
loopback address. --auth gives it one NKey user per role (submitter, worker,
operator, observer; docs/security.md): their seeds go to <data>/auth/<role>.nk
(mode 0600, kept across restarts) and a NATS CLI context per role,
jetcrew-<role>, is written where the NATS CLI reads them ($XDG_CONFIG_HOME,
else the home directory of the user in the password database, not $HOME) and
printed with its file, so that 'nats --context jetcrew-submitter ...' and
'jetcrew --context jetcrew-operator failed' work. The console then acts as the
operator and every request needs a token: $JETCREW_UI_TOKEN, else the one in
<data>/auth/ui.token (mode 0600, kept), printed as JETCREW_UI_TOKEN_FILE=<path>. --tlscert and --tlskey make
the server TLS-only (with --tlsca the contexts trust that CA).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.uiExplicit = cmd.Flags().Changed("ui")
			return a.runUp(cmd.Context(), o)
		},
	}
	cmd.Flags().StringVar(&o.listen, "listen", "127.0.0.1:4222", "host:port the NATS server listens on; port 0 picks a free one")
	cmd.Flags().StringVar(&o.dataDir, "data", ".jetcrew", "directory for JetStream's files")
	cmd.Flags().Int64Var(&o.storeMiB, "store-max-mib", defaultStoreMaxMiB,
		"most disk JetStream may use under --data, in MiB; must hold every stream's cap (--runs-max-mib, --events-max-mib, --failed-max-mib and 256 MiB of coordination)")
	cmd.Flags().BoolVar(&o.auth, "auth", false, "one NKey user per role, a NATS CLI context each (required beyond loopback)")
	cmd.Flags().StringVar(&o.ui, "ui", console.DefaultListen, "host:port the web console listens on (docs/console.md), printed as JETCREW_UI=<url>; \"off\" serves none")
	o.worker.addFlags(cmd.Flags())
	return cmd
}

// parseListen splits host:port for the server options: port 0 becomes
// server.RANDOM_PORT.
func parseListen(listen string) (string, int, error) {
	host, p, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("--listen %q: %w", listen, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("--listen %q: port must be a number from 0 to 65535", listen)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return host, port, nil
}

// clientURL is the URL local clients use: the server's own, with an
// unspecified listen address (0.0.0.0, ::) replaced by loopback.
func clientURL(s *server.Server, host string) string {
	u := s.ClientURL()
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsUnspecified() {
		return u
	}
	_, port, err := net.SplitHostPort(s.Addr().String())
	if err != nil {
		return u
	}
	loop := "127.0.0.1"
	if ip.To4() == nil {
		loop = "::1"
	}
	scheme, _, _ := strings.Cut(u, "://")
	return scheme + "://" + net.JoinHostPort(loop, port)
}

func (a serveCmds) runUp(ctx context.Context, o upOptions) error {
	host, port, err := parseListen(o.listen)
	if err != nil {
		return usageError(err)
	}
	profiles, err := o.worker.check()
	if err != nil {
		return err
	}
	uiListener, err := a.upConsoleListener(o)
	if err != nil {
		return err
	}
	stopUI := func() { // until the console serves on it
		if uiListener != nil {
			_ = uiListener.Close()
		}
	}
	defer func() { stopUI() }()
	dataDir, err := filepath.Abs(o.dataDir)
	if err != nil {
		return usageError(fmt.Errorf("--data %q: %w", o.dataDir, err))
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}

	if o.storeMiB < 1 {
		return usageError(fmt.Errorf("--store-max-mib %d: must be positive", o.storeMiB))
	}
	sopts, keys, err := a.upServer(o, host, port, dataDir)
	if err != nil {
		return err
	}
	s, slog, err := a.startServer(sopts)
	if err != nil {
		return err
	}
	defer func() {
		s.Shutdown()
		s.WaitForShutdown()
		a.log.Info().Msg("nats-server stopped")
	}()
	url := clientURL(s, host)
	inProcess, consoleOpts, err := inProcessOptions(s, sopts.TLS, keys)
	if err != nil {
		return err
	}
	consoleConn := upConsoleConn{url: url, opts: consoleOpts, keys: keys}
	consoleConn.token, consoleConn.tokenFile, err = a.upConsoleToken(keys, uiListener != nil, dataDir)
	if err != nil {
		return err
	}
	nc, err := a.dial(url, "jetcrew up", inProcess...)
	if err != nil {
		return err
	}
	defer nc.Close()
	defer func() { stopUI() }() // before nc closes; stopUI is idempotent
	consoleConn.nc = nc
	a.log.Info().Str("url", url).Str("data", dataDir).Bool("auth", keys != nil).Bool("tls", sopts.TLS).Msg("nats-server ready")
	if err := a.announceAuth(url, keys); err != nil {
		return err
	}

	hint := "jetcrew submit --nats " + url + " 'echo hello'"
	if keys != nil {
		hint = "jetcrew --context " + contextPrefix + string(roles.Submitter) + " submit 'echo hello'"
	}
	return workerCmds{a.app}.serveWorker(ctx, nc, o.worker, profiles, func(w *worker.Worker) {
		fmt.Fprintf(a.stdout, "NATS_URL=%s\n", url)
		stopUI = a.upConsole(ctx, consoleConn, uiListener)
		a.log.Info().Str("url", url).Str("worker", w.ID()).Msg("jetcrew is up; submit runs with: " + hint)
	}, slog.fatal)
}

// startServer starts the embedded nats-server with sopts, its log routed
// through zerolog, and waits until it accepts connections (at most
// serverReadyTimeout) or reports a fatal error. The caller shuts it down.
func (a serveCmds) startServer(sopts *server.Options) (*server.Server, *serverLogger, error) {
	s, err := server.NewServer(sopts)
	if err != nil {
		return nil, nil, fmt.Errorf("nats-server: %w", err)
	}
	slog := newServerLogger(a.log)
	debug, trace := slog.enable()
	s.SetLoggerV2(slog, debug, trace, false)
	go s.Start()
	// Readiness is checked in short steps, with the fatal channel looked at
	// between them, so no goroutine outlives a server that failed to start.
	deadline := time.Now().Add(serverReadyTimeout)
	for !s.ReadyForConnections(serverReadyStep) {
		select {
		case msg := <-slog.fatal:
			s.Shutdown()
			return nil, nil, fmt.Errorf("nats-server: %s", msg)
		default:
		}
		if time.Now().After(deadline) {
			s.Shutdown()
			return nil, nil, fmt.Errorf("nats-server: not ready for connections within %s", serverReadyTimeout)
		}
	}
	return s, slog, nil
}

// inProcessOptions returns the options of up's own in-process connection
// to s (with the worker role's credentials under --auth) and the same
// without credentials, for the console.
func inProcessOptions(s *server.Server, useTLS bool, keys roleKeys) (own, console []nats.Option, err error) {
	own = []nats.Option{nats.InProcessServer(s), nats.MaxReconnects(-1)}
	if useTLS {
		// The server speaks TLS on its in-process pipe too; the pipe never
		// leaves this process, so there is no peer to verify.
		own = append(own, nats.Secure(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12})) //nolint:gosec // in-process pipe
	}
	console = slices.Clone(own)
	if keys != nil {
		opts, err := workerAuth(keys)
		if err != nil {
			return nil, nil, err
		}
		own = append(own, opts...)
	}
	return own, console, nil
}
