// Package bridgecmd is the bridge command of a jetcrew run container: the
// MCP server an agent's CLI starts with no arguments and speaks MCP to over
// stdio, and the agent's launcher ("launch"). The jetcrew binary runs it as
// `jetcrew bridge [launch ...]`, or when started under the name "bridge"
// (the worker mounts the binary at /opt/jetcrew/bridge); the separate
// jetcrew-bridge binary runs nothing else.
//
// The MCP server offers the tools status, send and inbox (see package
// coordination/bridge) and relays every call over the run's unix socket,
// /run/jetcrew/bridge.sock (JETCREW_BRIDGE_SOCKET overrides it), to the
// worker. When the socket cannot be reached the server still starts and lists
// its tools, and every call answers "coordination unavailable: ...".
//
// A run outlives its worker: while the worker is replaced (a restart, an
// upgrade, a crash; the successor serves the run's sockets again at the
// same paths), a tool call waits for the socket, up to a bounded window
// (relay.ReconnectWindow, 60 s; JETCREW_BRIDGE_RECONNECT sets another, "0"
// none), and one cut off in flight is made again when it is safe to repeat,
// else it answers "coordination interrupted: ..." (package relay,
// reconnect.go). The steered launcher's steer polls and the egress relay's
// connections wait for their sockets the same way.
//
// stdout carries JSON-RPC frames and nothing else, whatever happens;
// diagnostics go to stderr. JETCREW_BRIDGE_LOG sets their level (debug, info,
// warn, error; default info). The process collects garbage at GOGC=400 unless
// the environment sets GOGC (GCPercent says why), with a soft memory limit
// of 24 MiB unless it sets GOMEMLIMIT (MemoryLimit).
package bridgecmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/jetcrew/jetcrew/coordination/bridge"
	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

// Version is reported by the MCP server; set it before Main (the binaries
// set it from their build-time version).
var Version = "dev"

// maxFrameBytes bounds one inbound JSON-RPC frame, in bytes. A send's body is
// at most 16 KiB, so 1 MiB leaves ample room; a larger frame ends the session.
const maxFrameBytes = 1 << 20

// helloTimeout bounds the announcement to the worker at start.
const helloTimeout = 5 * time.Second

// Name is the base name under which the jetcrew binary acts as the bridge
// (its mount point in a run container is /opt/jetcrew/bridge).
const Name = "bridge"

// IsBridgeName reports whether argv0, a process's argv[0], names the bridge:
// its base name is Name or "jetcrew-bridge".
func IsBridgeName(argv0 string) bool {
	base := filepath.Base(argv0)
	return base == Name || base == "jetcrew-bridge"
}

// GCPercent is the bridge process's garbage collection target (see
// runtime/debug.SetGCPercent) unless the environment sets GOGC. The MCP SDK
// allocates a fresh 32 KiB decode buffer for every JSON value it unmarshals,
// several per tool call, so with Go's default of 100 and the bridge's small
// live heap the collector ran every few calls and took about a third of the
// bridge's CPU: a tool call's latency on a busy host. The runtime's
// smallest heap goal, 4 MiB at GOGC=100, scales with it: at 400 the bridge
// collects at about 16 MiB of heap.
const GCPercent = 400

// MemoryLimit is the bridge process's soft memory limit in bytes (see
// runtime/debug.SetMemoryLimit) unless the environment sets GOMEMLIMIT: it
// bounds what GCPercent may cost a run container whose memory limit is
// small, since the collector works harder as the heap nears it instead of
// letting it grow to four times the live heap.
const MemoryLimit = 24 << 20

// Main runs the bridge command with args (after the program name or the
// "bridge" subcommand) on the process's stdio, stopping on SIGTERM or
// SIGINT, and returns the exit code (see Run). It sets GCPercent unless
// GOGC is set. From here on os.Stdout is stderr: the real stdout belongs to
// the JSON-RPC frames alone.
func Main(args []string) int {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(GCPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(MemoryLimit)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	stdout := os.Stdout
	// Anything in this process that prints to os.Stdout by mistake lands on
	// stderr.
	os.Stdout = os.Stderr
	return Run(ctx, args, os.Stdin, stdout, os.Stderr, os.Getenv)
}

// Run serves MCP on stdin/stdout until stdin ends (exit 0), ctx is cancelled
// (SIGTERM or SIGINT: exit 0), or the session fails on a broken frame (exit
// 1). Arguments are refused (exit 2), but for "launch" (see launch). Only
// JSON-RPC frames are written to stdout; everything else goes to stderr.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) > 0 && args[0] == launchCommand {
		return launch(args[1:], stdout, stderr, getenv)
	}
	if len(args) > 0 && args[0] == egressRelayCommand {
		return egressRelay(stderr, getenv)
	}
	if len(args) > 0 {
		fmt.Fprintf(stderr, "jetcrew-bridge %s: takes no arguments; it serves MCP over stdio (socket: $%s, default %s)\n",
			Version, relay.EnvSocket, relay.DefaultSocketPath)
		return 2
	}
	level := LogLevel(getenv("JETCREW_BRIDGE_LOG"))
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	// The SDK's info lines (session connected, ...) are noise unless debugging.
	sdkLog := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: max(level, slog.LevelWarn)}))
	if level == slog.LevelDebug {
		sdkLog = log
	}
	path := getenv(relay.EnvSocket)
	if path == "" {
		path = relay.DefaultSocketPath
	}
	window, err := relay.ReconnectWindowFrom(getenv)
	if err != nil {
		log.Warn("reconnect window", "error", err)
	}
	client := relay.NewClientWith(path, relay.ClientOptions{ReconnectWindow: window})
	defer client.Close()
	// On a signal, cut calls in flight short (an inbox call may be waiting
	// for up to 30s): the session ends as soon as its handlers return.
	stopCalls := context.AfterFunc(ctx, client.Close)
	defer stopCalls()
	log.Info("jetcrew-bridge starting", "version", Version, "socket", path, "reconnect_window", window)

	// Announce the bridge to the worker so the run records that its bridge
	// connected. It never delays serving; the goroutine ends when Hello
	// returns (helloTimeout at most), or when run returns, which waits for
	// it.
	bg, stopBg := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopBg(); wg.Wait() }()
	wg.Go(func() {
		hctx, cancel := context.WithTimeout(bg, helloTimeout)
		defer cancel()
		if err := client.Hello(hctx); err != nil && bg.Err() == nil {
			log.Warn("tool calls will fail until the worker is reachable", "error", err)
		}
	})

	srv := bridge.NewServer(client, bridge.Options{
		Version:   Version,
		Logger:    sdkLog.With("component", "mcp-sdk"),
		Workspace: workspaceDir(),
	})
	// Steers put in the inbox are announced to the client as they come;
	// the goroutine ends with ctx, or when run returns.
	wg.Go(func() { bridge.WatchSteers(bg, srv, client) })
	// JSON-RPC batches are answered (or refused) per the negotiated
	// revision by the filter, never by the SDK, which could end the session.
	batches := bridge.NewBatches(stdout)
	err = srv.Run(ctx, &mcp.IOTransport{
		Reader:        batches.Reader(stdin, maxFrameBytes),
		Writer:        nopWriteCloser{batches},
		MaxLineLength: maxFrameBytes,
	})
	switch {
	case err == nil, errors.Is(err, io.EOF):
		log.Info("client closed the session")
		return 0
	case ctx.Err() != nil:
		log.Info("stopping on signal")
		return 0
	default:
		log.Error("session failed", "error", err)
		return 1
	}
}

// workspaceDir is the run's workspace, messages.WorkspaceDir, when the
// container has one: claimed patterns are resolved there
// (bridge.Options.Workspace). "" otherwise.
func workspaceDir() string {
	if fi, err := os.Stat(messages.WorkspaceDir); err == nil && fi.IsDir() {
		return messages.WorkspaceDir
	}
	return ""
}

// nopWriteCloser keeps the transport from closing stdout.
type nopWriteCloser struct{ io.Writer }

// Close does nothing: stdout stays open for the process's lifetime.
func (nopWriteCloser) Close() error { return nil }

// LogLevel maps JETCREW_BRIDGE_LOG's value to a level: debug, warn, error,
// else info.
func LogLevel(s string) slog.Level {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug
	case "warn", "warning":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}
