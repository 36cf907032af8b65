package main

import (
	"bufio"
	"encoding/json"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// startWaiting starts `launch --handoff SOCKET` with env and returns the
// command and the connection the launcher made to the socket.
func startWaiting(t *testing.T, env []string) (*exec.Cmd, *strings.Builder, net.Conn) {
	t.Helper()
	bin, err := buildBridge()
	require.NoError(t, err)
	sock := filepath.Join(t.TempDir(), messages.HandoffName)
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	cmd := exec.Command(bin, "launch", "--handoff", sock)
	cmd.Env = env
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	require.NoError(t, ln.(*net.UnixListener).SetDeadline(time.Now().Add(20*time.Second)))
	conn, err := ln.Accept()
	require.NoError(t, err, "the launcher connects to its hand-off socket")
	t.Cleanup(func() { _ = conn.Close() })
	return cmd, &out, conn
}

// A warm container's launcher waits on its hand-off socket, then takes the
// run: it sets the run's environment over its own, changes to the run's
// working directory, acknowledges and executes the run's command.
func TestLaunchHandoff(t *testing.T) {
	t.Parallel()
	cmd, out, conn := startWaiting(t, []string{"HOME=/home/agent", "KEEP=container", "OVER=container", "PATH=/nonexistent"})
	dir := t.TempDir()
	h, err := json.Marshal(messages.Handoff{
		Argv: []string{"sh", "-c", `echo "$KEEP $OVER $RUN"; pwd`},
		Env:  []string{"OVER=run", "RUN=yes", "PATH=/usr/bin:/bin"},
		Dir:  dir,
	})
	require.NoError(t, err)
	_, err = conn.Write(append(h, '\n'))
	require.NoError(t, err)
	ack, err := bufio.NewReader(conn).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, messages.HandoffAck, ack)
	require.NoError(t, cmd.Wait())
	require.Equal(t, "container run yes\n"+dir+"\n", out.String(), "the run's env over the container's; the command looked up on the run's PATH")
}

// A launcher whose socket closes without a run exits 0 (the pool was
// drained); one handed something that is not a run exits 1 without
// acknowledging it; a command it cannot find exits 127 after the
// acknowledgment, as a cold container's would.
func TestLaunchHandoffRefusals(t *testing.T) {
	t.Parallel()
	t.Run("closed", func(t *testing.T) {
		t.Parallel()
		cmd, _, conn := startWaiting(t, []string{"PATH=/usr/bin:/bin"})
		require.NoError(t, conn.Close())
		require.NoError(t, cmd.Wait())
	})
	t.Run("not a run", func(t *testing.T) {
		t.Parallel()
		cmd, out, conn := startWaiting(t, []string{"PATH=/usr/bin:/bin"})
		_, err := conn.Write([]byte(`{"argv":[]}` + "\n"))
		require.NoError(t, err)
		var ee *exec.ExitError
		require.ErrorAs(t, cmd.Wait(), &ee)
		require.Equal(t, 1, ee.ExitCode())
		require.Contains(t, out.String(), "not a run")
		b := make([]byte, 1)
		_, err = conn.Read(b)
		require.Error(t, err, "no acknowledgment")
	})
	t.Run("missing command", func(t *testing.T) {
		t.Parallel()
		cmd, _, conn := startWaiting(t, []string{"PATH=/usr/bin:/bin"})
		_, err := conn.Write([]byte(`{"argv":["/nonexistent/agent"]}` + "\n"))
		require.NoError(t, err)
		ack, err := bufio.NewReader(conn).ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, messages.HandoffAck, ack)
		var ee *exec.ExitError
		require.ErrorAs(t, cmd.Wait(), &ee)
		require.Equal(t, 127, ee.ExitCode())
	})
	t.Run("flags", func(t *testing.T) {
		t.Parallel()
		bin, err := buildBridge()
		require.NoError(t, err)
		err = exec.Command(bin, "launch", "--handoff", "/x", "--", "echo").Run()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee)
		require.Equal(t, 2, ee.ExitCode(), "--handoff takes no command")
	})
}
