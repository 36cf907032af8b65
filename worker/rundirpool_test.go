package worker_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// seenDir is what a fake container saw of its run directory.
type seenDir struct {
	path  string
	info  os.FileInfo
	names []string
	mcp   []byte
	sock  os.FileInfo // the socket file, if any
	// pooled is how many directories the pool held meanwhile.
	pooled int
}

// recordRunDirs makes every container of rt report its run directory on
// the returned channel, then exit 0.
func recordRunDirs(t *testing.T, rt *workertest.Runtime) <-chan seenDir {
	t.Helper()
	seen := make(chan seenDir, 8)
	rt.Behave = func(jail.ContainerSpec) (workertest.Behaviour, error) {
		return func(_ context.Context, spec jail.ContainerSpec, _ jail.OutputFunc) jail.ExitStatus {
			s := seenDir{path: runDirOf(spec)}
			s.info, _ = os.Stat(s.path)
			if es, err := os.ReadDir(s.path); err == nil {
				for _, e := range es {
					s.names = append(s.names, e.Name())
				}
			}
			s.mcp, _ = os.ReadFile(filepath.Join(s.path, messages.MCPConfigName))
			s.sock, _ = os.Lstat(filepath.Join(s.path, messages.SocketName))
			// The pool is StateDir/p; the run directory is StateDir/r/<hex>.
			pool, _ := os.ReadDir(filepath.Join(filepath.Dir(filepath.Dir(s.path)), "p"))
			s.pooled = len(pool)
			seen <- s
			return jail.ExitStatus{}
		}, nil
	}
	return seen
}

// A coordination run's directory leaves its path when the run ends, kept in
// the worker's pool holding mcp.json and its socket, still bound; the next
// run takes the same directory under its own path, with mcp.json intact,
// and its session serves the same socket; a stopped worker leaves no pool
// behind.
func TestRunDirsPooled(t *testing.T) {
	t.Parallel()
	stateDir := workertest.StateDir(t)
	rt := workertest.NewTestRuntime(t)
	seen := recordRunDirs(t, rt)
	b := setup(t, func(c *worker.Config) { c.StateDir, c.Runtime, c.Concurrency = stateDir, rt, 1 })
	pool := filepath.Join(stateDir, "p")

	b.submit(t, messages.RunRequest{ID: "pool-a", Profile: "shell", Prompt: "true"})
	require.Equal(t, messages.StateSucceeded, b.waitFinal(t, "pool-a").State)
	a := <-seen
	require.ElementsMatch(t, []string{messages.MCPConfigName, messages.SocketName}, a.names)
	require.Equal(t, coordination.MCPConfig(), a.mcp)
	var pooled []os.DirEntry
	require.Eventually(t, func() bool {
		_, err := os.Stat(a.path)
		pooled, _ = os.ReadDir(pool)
		return os.IsNotExist(err) && len(pooled) == 1
	}, 10*time.Second, 10*time.Millisecond, "run a's directory is gone from its path and pooled")
	left, err := os.ReadDir(filepath.Join(pool, pooled[0].Name()))
	require.NoError(t, err)
	require.Len(t, left, 2)
	sockA, err := os.Lstat(filepath.Join(pool, pooled[0].Name(), messages.SocketName))
	require.NoError(t, err, "the socket stays with the pooled directory")
	require.Equal(t, os.ModeSocket|coordination.SocketMode, sockA.Mode())

	b.submit(t, messages.RunRequest{ID: "pool-b", Profile: "shell", Prompt: "true"})
	require.Equal(t, messages.StateSucceeded, b.waitFinal(t, "pool-b").State)
	bs := <-seen
	require.NotEqual(t, a.path, bs.path, "each delivery has its own path")
	require.True(t, os.SameFile(a.info, bs.info), "run b took the pooled directory")
	require.Zero(t, bs.pooled, "the pool gave its directory to run b")
	require.ElementsMatch(t, []string{messages.MCPConfigName, messages.SocketName}, bs.names)
	require.Equal(t, coordination.MCPConfig(), bs.mcp)
	require.Equal(t, coordination.RunDirMode, bs.info.Mode().Perm())
	require.True(t, os.SameFile(sockA, bs.sock), "run b's session serves the socket run a's kept bound")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, b.w.Stop(ctx))
	_, err = os.Stat(pool)
	require.True(t, os.IsNotExist(err), "the pool is removed with the worker: %v", err)
}

// A run directory whose container could not be removed is not pooled (the
// container may still mount it): it is removed, and the next run stages a
// new one.
func TestRunDirNotPooledWhileContainerRemains(t *testing.T) {
	t.Parallel()
	stateDir := workertest.StateDir(t)
	rt := workertest.NewTestRuntime(t)
	rt.RemoveErr = func(string) error { return errors.New("daemon unavailable") }
	seen := recordRunDirs(t, rt)
	b := setup(t, func(c *worker.Config) { c.StateDir, c.Runtime, c.Concurrency = stateDir, rt, 1 })

	b.submit(t, messages.RunRequest{ID: "keep-a", Profile: "shell", Prompt: "true"})
	require.Equal(t, messages.StateSucceeded, b.waitFinal(t, "keep-a").State)
	a := <-seen
	require.Eventually(t, func() bool { _, err := os.Stat(a.path); return os.IsNotExist(err) }, 10*time.Second, 10*time.Millisecond)
	pooled, err := os.ReadDir(filepath.Join(stateDir, "p"))
	require.NoError(t, err)
	require.Empty(t, pooled)

	b.submit(t, messages.RunRequest{ID: "keep-b", Profile: "shell", Prompt: "true"})
	require.Equal(t, messages.StateSucceeded, b.waitFinal(t, "keep-b").State)
	<-seen
	// (An inode number may be reused by a new directory, so the pool being
	// empty is the evidence that run b staged its own.)
	pooled, err = os.ReadDir(filepath.Join(stateDir, "p"))
	require.NoError(t, err)
	require.Empty(t, pooled)
}

// poolOneRunDir starts a worker of concurrency 1 whose runs' directories
// seen reports, runs a coordination run id to success and waits until its
// directory is the pool's only one; it returns the test bundle, seen (the
// run's report already taken) and that directory.
func poolOneRunDir(t *testing.T, id string) (*testBundle, <-chan seenDir, string) {
	t.Helper()
	stateDir := workertest.StateDir(t)
	rt := workertest.NewTestRuntime(t)
	seen := recordRunDirs(t, rt)
	b := setup(t, func(c *worker.Config) { c.StateDir, c.Runtime, c.Concurrency = stateDir, rt, 1 })
	pool := filepath.Join(stateDir, "p")
	b.submit(t, messages.RunRequest{ID: id, Profile: "shell", Prompt: "true"})
	require.Equal(t, messages.StateSucceeded, b.waitFinal(t, id).State)
	<-seen
	var pooled []os.DirEntry
	require.Eventually(t, func() bool { pooled, _ = os.ReadDir(pool); return len(pooled) == 1 }, 10*time.Second, 10*time.Millisecond)
	return b, seen, filepath.Join(pool, pooled[0].Name())
}

// A pooled directory whose mcp.json is not the one the worker wrote is
// never handed to a run: it is removed and the run stages a new directory.
func TestTamperedPooledRunDirDropped(t *testing.T) {
	t.Parallel()
	b, seen, dir := poolOneRunDir(t, "tamper-a")
	mcp := filepath.Join(dir, messages.MCPConfigName)
	require.NoError(t, os.Chmod(mcp, 0o644))
	require.NoError(t, os.WriteFile(mcp, []byte(`{"mcpServers":{}}`), 0o644))

	b.submit(t, messages.RunRequest{ID: "tamper-b", Profile: "shell", Prompt: "true"})
	require.Equal(t, messages.StateSucceeded, b.waitFinal(t, "tamper-b").State)
	bs := <-seen
	require.Equal(t, coordination.MCPConfig(), bs.mcp, "run b did not get the tampered directory")
	_, err := os.Stat(filepath.Dir(mcp))
	require.True(t, os.IsNotExist(err), "the tampered directory was removed: %v", err)
}

// A connection left waiting on a pooled directory's socket (as a process of
// the earlier run's container could leave one before the container was
// removed) is closed unread when the next run takes the directory: the
// next run's session never answers it, and the run is recorded as one
// whose bridge never connected.
func TestPooledSocketDropsWaitingConnections(t *testing.T) {
	t.Parallel()
	b, seen, dir := poolOneRunDir(t, "stale-a")
	c, err := net.Dial("unix", filepath.Join(dir, messages.SocketName))
	require.NoError(t, err, "the pooled socket is bound")
	defer c.Close()
	_, err = io.WriteString(c, "POST "+relay.PathHello+" HTTP/1.1\r\nHost: run\r\nContent-Length: 0\r\n\r\n")
	require.NoError(t, err)

	b.submit(t, messages.RunRequest{ID: "stale-b", Profile: "shell", Prompt: "true"})
	st := b.waitFinal(t, "stale-b")
	bs := <-seen
	require.Zero(t, bs.pooled, "run b took the pooled directory")
	require.Equal(t, messages.StateSucceeded, st.State)
	require.False(t, st.BridgeConnected, "the waiting request never reached run b's session")
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	n, err := c.Read(make([]byte, 64))
	require.Zero(t, n, "no answer")
	require.True(t, errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET), "the waiting connection was closed: %v", err)
}
