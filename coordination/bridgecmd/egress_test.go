package bridgecmd

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// relayed starts the egress relay's side of one agent connection to sock
// (relayConn, waiting up to window) and returns the agent's end.
func relayed(t *testing.T, sock string, window time.Duration) net.Conn {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err == nil {
			relayConn(c, sock, window)
		}
	}()
	agent, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = agent.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("relayConn did not return")
		}
	})
	return agent
}

// echoProxy serves sock as a stand-in for the worker's egress proxy,
// echoing what it reads, until the test ends.
func echoProxy(t *testing.T, sock string) {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
}

// proxySocket is a path for the proxy's socket in a short temp dir.
func proxySocket(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "jce")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "egress.sock")
}

// A connection the agent opens while the worker is replaced (no proxy
// socket) waits for the socket and is joined to the proxy once it is
// back.
func TestEgressRelayWaitsForTheProxySocket(t *testing.T) {
	t.Parallel()
	sock := proxySocket(t)
	agent := relayed(t, sock, 20*time.Second)
	_, err := io.WriteString(agent, "CONNECT example.com:443\n")
	require.NoError(t, err)
	time.Sleep(1500 * time.Millisecond)
	echoProxy(t, sock)
	require.NoError(t, agent.SetReadDeadline(time.Now().Add(5*time.Second)))
	line, err := bufio.NewReader(agent).ReadString('\n')
	require.NoError(t, err, "the connection was joined to the proxy once its socket came back")
	require.Equal(t, "CONNECT example.com:443\n", line)
}

// Past the window the agent's connection is closed unanswered.
func TestEgressRelayGivesUpPastTheWindow(t *testing.T) {
	t.Parallel()
	start := time.Now()
	agent := relayed(t, proxySocket(t), time.Second)
	require.NoError(t, agent.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err := agent.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
	require.Greater(t, time.Since(start), 500*time.Millisecond, "it waited for the socket")
}

// A connection in flight when the proxy goes away is closed: the agent
// reads its end.
func TestEgressRelayClosesWhatTheProxyDropped(t *testing.T) {
	t.Parallel()
	sock := proxySocket(t)
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer ln.Close()
	agent := relayed(t, sock, 20*time.Second)
	u, err := ln.Accept()
	require.NoError(t, err)
	_, err = io.WriteString(agent, "GET / HTTP/1.1\n")
	require.NoError(t, err)
	_, err = bufio.NewReader(u).ReadString('\n')
	require.NoError(t, err)
	require.NoError(t, u.Close()) // the worker dies mid-request
	require.NoError(t, agent.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = agent.Read(make([]byte, 1))
	require.Error(t, err)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the agent's connection was closed, not left hanging: %v", err)
}
