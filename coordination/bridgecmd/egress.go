package bridgecmd

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/jetcrew/jetcrew/coordination/relay"
)

// egressRelayCommand is the first argument that makes the bridge binary the
// run's egress relay: it accepts TCP connections on the listener passed as
// file descriptor 3 (127.0.0.1:3128, where the run's HTTPS_PROXY points)
// and joins each to the worker's egress proxy over the run's unix socket
// (JETCREW_EGRESS_SOCKET). The container has no network but loopback, so
// this pipe is its only way out; the worker's end decides what passes. The
// launcher starts it (launch --egress-relay); it ends with the container.
//
// While the worker is replaced (its successor serves the socket again at
// the same path), a connection the agent opens waits for the socket, up to
// the reconnect window (relay.ReconnectWindow; JETCREW_BRIDGE_RECONNECT
// sets another), before it is closed unanswered; a connection in flight
// when the worker went away is closed, and the agent's HTTP client opens a
// new one.
const egressRelayCommand = "egress-relay"

// maxRelayConns bounds the relay's open connections; the worker's proxy
// has its own, lower, cap per run.
const maxRelayConns = 256

// startEgressRelay listens on addr ("127.0.0.1:3128") and starts this binary
// as egressRelayCommand with the listener, so the port accepts connections
// before the agent starts: none is refused for being early.
func startEgressRelay(spec string, stderr io.Writer) error {
	addr, sock, ok := strings.Cut(spec, "=")
	if !ok || addr == "" || sock == "" {
		return fmt.Errorf("--egress-relay %q: want ADDR=SOCKET", spec)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("egress relay: %w", err)
	}
	defer l.Close()
	f, err := l.(*net.TCPListener).File()
	if err != nil {
		return fmt.Errorf("egress relay: %w", err)
	}
	defer f.Close()
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("egress relay: %w", err)
	}
	cmd := exec.Command(self, egressRelayCommand)
	cmd.ExtraFiles = []*os.File{f}
	cmd.Env = append(os.Environ(), "JETCREW_EGRESS_SOCKET="+sock)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("egress relay: %w", err)
	}
	// The relay outlives this process (which becomes the agent by
	// execve); its exit status is not waited for.
	return cmd.Process.Release()
}

// egressRelay implements egressRelayCommand. It returns only when the
// listener fails.
func egressRelay(stderr io.Writer, getenv func(string) string) int {
	sock := getenv("JETCREW_EGRESS_SOCKET")
	if sock == "" {
		fmt.Fprintln(stderr, "jetcrew-bridge egress-relay: JETCREW_EGRESS_SOCKET is not set")
		return 2
	}
	window, err := relay.ReconnectWindowFrom(getenv)
	if err != nil {
		fmt.Fprintf(stderr, "jetcrew-bridge egress-relay: %v\n", err)
	}
	l, err := net.FileListener(os.NewFile(3, "egress-listener"))
	if err != nil {
		fmt.Fprintf(stderr, "jetcrew-bridge egress-relay: %v\n", err)
		return 2
	}
	slots := make(chan struct{}, maxRelayConns)
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return 0
			}
			fmt.Fprintf(stderr, "jetcrew-bridge egress-relay: %v\n", err)
			return 1
		}
		select {
		case slots <- struct{}{}:
		default:
			_ = c.Close()
			continue
		}
		go func() {
			defer func() { <-slots }()
			relayConn(c, sock, window)
		}()
	}
}

// relayConn joins c to a new connection to the unix socket at sock, both
// ways, until both directions end. While nobody serves the socket (the
// worker is being replaced) the dial is tried again, with
// relay.ReconnectBackOff, for up to window; past it, or when the socket
// cannot be dialled for another reason, c is closed: the run's connection
// fails, closed. When the proxy's side breaks (the worker went away), c is
// closed at once, not only half-closed.
func relayConn(c net.Conn, sock string, window time.Duration) {
	defer c.Close()
	u, err := backoff.RetryWithData(func() (net.Conn, error) {
		u, err := net.Dial("unix", sock)
		if err != nil && !relay.SocketGone(err) {
			return nil, backoff.Permanent(err)
		}
		return u, err
	}, relay.ReconnectBackOff(window))
	if err != nil {
		return
	}
	defer u.Close()
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := io.Copy(c, u); err != nil {
			_ = c.Close() // the agent's reads and writes fail now
			return
		}
		_ = c.(*net.TCPConn).CloseWrite()
	})
	_, _ = io.Copy(u, c)
	_ = u.(*net.UnixConn).CloseWrite()
	wg.Wait()
}
