package tests

// The jail under gVisor (runtime "runsc"), proven the same way as under runc
// (jail_test.go): the real worker, a fresh nats-server, runs submitted like
// any client's, facts measured by the jailed process itself. The assertions
// are written for what gVisor shows: its own kernel (uname -r says 4.4.0),
// its own /proc (no NoNewPrivs line, Seccomp 0: the host's filter applies to
// gVisor's Sentry, not to the process's view), its own mountinfo (the root
// and every bind mount are 9p mounts served by the gofer). docs/jail.md has
// the column that says what gVisor adds and what it cannot give.
//
// The suite needs the engine to have the "runsc" runtime registered
// (scripts/install-runtimes.sh does it; .ci/run runs that script first).
// Without it the suite is skipped with a message saying so, and `make test`
// prints a line saying the gVisor suite did not run; with
// JETCREW_REQUIRE_GVISOR=1 (set by .ci/run) a missing runsc fails instead.

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	dockernet "github.com/docker/docker/api/types/network"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/workertest"
	"github.com/jetcrew/jetcrew/workspace"
)

// gvisorRuntime is the OCI runtime name the gVisor suite runs under, as
// scripts/install-runtimes.sh registers it (--network=none --host-uds=open).
const gvisorRuntime = "runsc"

var (
	gvisorOnce  sync.Once
	gvisorNames []string
	gvisorErr   error
)

// requireGVisorNet returns when the engine also offers gvisorNetRuntime
// (call requireGVisor first); otherwise it fails under
// JETCREW_REQUIRE_GVISOR (CI) and skips, saying why, when not.
func requireGVisorNet(t *testing.T) {
	t.Helper()
	if slices.Contains(gvisorNames, gvisorNetRuntime) {
		return
	}
	msg := fmt.Sprintf("the engine has no %q runtime; scripts/install-runtimes.sh registers it", gvisorNetRuntime)
	if os.Getenv("JETCREW_REQUIRE_GVISOR") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// requireGVisor returns when the engine offers gvisorRuntime. Otherwise it
// fails the test when JETCREW_REQUIRE_GVISOR is set (CI) and skips it, with
// a message naming what the engine has, when not.
func requireGVisor(t *testing.T) {
	t.Helper()
	_, cli := jailDocker(t)
	gvisorOnce.Do(func() {
		info, err := cli.Info(context.Background())
		gvisorErr = err
		gvisorNames = slices.Sorted(maps.Keys(info.Runtimes))
	})
	require.NoError(t, gvisorErr)
	if slices.Contains(gvisorNames, gvisorRuntime) {
		return
	}
	msg := fmt.Sprintf("the gVisor suite did not run: the Docker engine has no %q runtime (it has %s); "+
		"scripts/install-runtimes.sh (as root) installs and registers it", gvisorRuntime, strings.Join(gvisorNames, ", "))
	if os.Getenv("JETCREW_REQUIRE_GVISOR") != "" {
		t.Fatal(msg + " (JETCREW_REQUIRE_GVISOR is set)")
	}
	t.Skip(msg)
}

// gvisorNetRuntime is runsc registered for profiles with a network
// (--network=host: the Sentry uses the network namespace Docker made for the
// container, through the host kernel's network stack), as
// scripts/install-runtimes.sh registers it.
const gvisorNetRuntime = "runsc-net"

// gvisorProfile is jailProfile under runsc.
func gvisorProfile(name, extra string) string {
	return jailProfile(name, fmt.Sprintf("runtime = %q\n%s", gvisorRuntime, extra))
}

// TestGVisorJail runs the jail's promises under gVisor, each subtest one
// run on one shared worker, in parallel.
func TestGVisorJail(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	requireGVisor(t)
	b := startJail(t, gvisorProfile("g", "user = \"4242:4343\"\nmemory_mib = 96\ncpus = 0.5")+
		gvisorProfile("gtight", "memory_mib = 32")+
		// The pids limit counts the Sentry's host threads, not the
		// processes inside (docs/jail.md): 50 orphans need room.
		gvisorProfile("gmany", "pids = 4096")+
		gvisorProfile("gbridge", `network = "bridge"`)+
		gvisorProfile("gsmall", "tmp_mib = 1\nhome_mib = 2")+
		gvisorProfile("gws", "memory_mib = 192\nworkspace_mib = 48")+
		jailProfile("gnet", fmt.Sprintf("runtime = %q\nnetwork = \"bridge\"", gvisorNetRuntime)), func(c *worker.Config) {
		c.Concurrency = 8
		c.StopGrace = 5 * time.Second
	})

	t.Run("identity", func(t *testing.T) {
		t.Parallel()
		gvisorIdentity(t, b)
	})
	t.Run("filesystem", func(t *testing.T) {
		t.Parallel()
		gvisorFilesystem(t, b)
	})
	t.Run("bridge over the host unix socket", func(t *testing.T) {
		t.Parallel()
		gvisorBridge(t, b)
	})
	t.Run("network none", func(t *testing.T) {
		t.Parallel()
		gvisorNetworkNone(t, b)
	})
	t.Run("network", func(t *testing.T) {
		t.Parallel()
		gvisorNetwork(t, b)
	})
	t.Run("workspace streamed in", func(t *testing.T) {
		t.Parallel()
		gvisorWorkspace(t, b)
	})
	t.Run("tmpfs sizes", func(t *testing.T) {
		t.Parallel()
		gvisorTmpfs(t, b)
	})
	t.Run("memory limit", func(t *testing.T) {
		t.Parallel()
		// The limit applies to the whole sandbox (Sentry and gofer), whose
		// host cgroup the kernel's OOM killer acts on.
		st, out := b.runScript(t, "gv-oom", "gtight", `echo start; x=aaaaaaaaaaaaaaaa; while :; do x=$x$x; done`)
		require.Equal(t, messages.StateFailed, st.State)
		require.Equal(t, 137, *st.ExitCode, "reason %q", st.Reason)
		require.Equal(t, "oom", st.Reason)
		require.Equal(t, "start\n", string(out.stdout))
	})
	t.Run("exit codes and output", func(t *testing.T) {
		t.Parallel()
		line := strings.Repeat("x", 200<<10)
		st, out := b.runScript(t, "gv-exit", "g", `printf 'out1\n'; printf 'err1\n' >&2; head -c 204800 /dev/zero | tr '\0' x; echo; printf 'last'; exit 42`)
		require.Equal(t, messages.StateFailed, st.State)
		require.Equal(t, 42, *st.ExitCode)
		require.Equal(t, "out1\n"+line+"\nlast", string(out.stdout))
		require.Equal(t, "err1\n", string(out.stderr))
	})
	t.Run("init reaps orphans", func(t *testing.T) {
		t.Parallel()
		st, out := b.runScript(t, "gv-init", "gmany", reaperScript(50))
		require.Equal(t, messages.StateSucceeded, st.State, "reason %q, stderr %s", st.Reason, out.stderr)
		v := values(out.stdout)
		require.Equal(t, "50", v["orphans"], "50 live orphans, children of PID 1: %s", out.stdout)
		require.Equal(t, "0", v["live"], "they all exited once released")
		require.Equal(t, "0", v["zombies"], "and PID 1 reaped every one")
		require.Equal(t, "docker-init", v["pid1"], "Docker's init is PID 1 inside gVisor too")
	})
	t.Run("timeout stops with SIGTERM", func(t *testing.T) {
		t.Parallel()
		b.submit(t, "gv-term", "g", `trap 'echo got TERM; exit 143' TERM; echo ready; sleep 60 & wait`, 2*time.Second)
		st := b.waitFinal(t, "gv-term")
		require.Equal(t, messages.StateTimedOut, st.State)
		require.Equal(t, 143, *st.ExitCode, "the process got SIGTERM and exited on it, before the grace")
		require.Equal(t, "ready\ngot TERM\n", string(b.output(t, "gv-term").stdout))
	})
}

// gvisorIdentity: uid and gid, no capabilities, a setuid-root binary does
// not make the process root, no user namespace, and gVisor's own kernel.
func gvisorIdentity(t *testing.T, b *jailBundle) {
	st, out := b.runScript(t, "gv-ident", "g", `
grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status | tr -d ' ' | tr '\t' '='
echo "kernel=$(uname -r)"
/bin/suidprobe
if (unshare -U -r true) 2>/dev/null; then echo userns=allowed; else echo userns=refused; fi
exit 0`)
	require.Equal(t, messages.StateSucceeded, st.State, "reason %q, stderr %s", st.Reason, out.stderr)
	v := values(out.stdout)
	require.Equal(t, "4.4.0", v["kernel"], "gVisor's Sentry answers uname, not the host kernel")
	require.Equal(t, "4242=4242=4242=4242", v["Uid:"])
	require.Equal(t, "4343=4343=4343=4343", v["Gid:"])
	require.NotContains(t, strings.Split(v["Groups:"], "="), "0")
	for _, c := range []string{"CapInh:", "CapPrm:", "CapEff:", "CapBnd:"} {
		require.Equal(t, "0000000000000000", v[c], c)
	}
	if x, ok := v["CapAmb:"]; ok {
		require.Equal(t, "0000000000000000", x)
	}
	_, hasNNP := v["NoNewPrivs:"]
	require.False(t, hasNNP, "gVisor's /proc/self/status has no NoNewPrivs line; its effect is measured with the probe")
	require.Equal(t, "0", v["Seccomp:"], "gVisor's /proc shows the process's own seccomp state; the host filter confines the Sentry")
	require.Equal(t, "4242", v["euid"], "a setuid-root binary must not raise privileges")
	require.Equal(t, "4343", v["egid"])
	require.Contains(t, string(out.stdout), "setuid0=operation not permitted")
	require.Equal(t, "refused", v["userns"])

	require.NotNil(t, st.Receipt)
	require.Equal(t, gvisorRuntime, st.Receipt.Runtime, "the receipt records the runtime")
	info, ok := b.rt.inspect("gv-ident")
	require.True(t, ok)
	require.Equal(t, gvisorRuntime, info.HostConfig.Runtime)
	require.True(t, info.HostConfig.ReadonlyRootfs)
}

// gvisorFilesystem: the root and the bind mounts are read-only in gVisor's
// own mountinfo (9p mounts served by the gofer), /tmp and HOME are
// writable, nothing else is, and no Docker socket exists.
func gvisorFilesystem(t *testing.T, b *jailBundle) {
	st, out := b.runScript(t, "gv-fs", "g", `
awk '{print "mnt:" $5 "=" $6 ":" $(NF-2)}' /proc/self/mountinfo
if echo x > /x 2>/dev/null; then echo root=writable; else echo root=refused; fi
if echo x > /tmp/x; then echo tmp=writable; fi
if echo x > "$HOME/x"; then echo home=writable; fi
if echo x > /run/jetcrew/x 2>/dev/null; then echo rundir=writable; else echo rundir=refused; fi
for s in /var/run/docker.sock /run/docker.sock /run/containerd/containerd.sock /var/run/containerd/containerd.sock; do
  [ -e "$s" ] && echo "docker_socket=$s"
done
echo "home_mode=$(stat -c %a "$HOME") home_owner=$(stat -c %u:%g "$HOME")"
exit 0`)
	require.Equal(t, messages.StateSucceeded, st.State, "reason %q, stderr %s", st.Reason, out.stderr)
	v := values(out.stdout)
	require.Equal(t, "ro:9p", v["mnt:/"], "the root is gVisor's read-only 9p mount")
	require.Equal(t, "ro:9p", v["mnt:/run/jetcrew"], "the run directory is read-only")
	require.Equal(t, "ro:9p", v["mnt:/opt/jetcrew/bridge"], "the bridge binary is read-only")
	require.True(t, strings.HasPrefix(v["mnt:/tmp"], "rw"), "/tmp: %q", v["mnt:/tmp"])
	require.Equal(t, "refused", v["root"])
	require.Equal(t, "refused", v["rundir"])
	require.Equal(t, "writable", v["tmp"])
	require.Equal(t, "writable", v["home"])
	require.Equal(t, "4242:4343", v["home_owner"])
	require.Empty(t, v["docker_socket"], "no Docker or containerd socket")
}

// gvisorBridge: the bridge inside the sandbox reaches the worker through the
// run's unix socket on the host (runsc's --host-uds=open) and answers the
// status tool with the run's own id.
func gvisorBridge(t *testing.T, b *jailBundle) {
	const frames = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"gvisor-test","version":"0"}}}
{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}
{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"status","arguments":{}}}
`
	script := fmt.Sprintf("(printf '%%s' '%s'; sleep 3) | /opt/jetcrew/bridge", frames)
	st, out := b.runScript(t, "gv-bridge", "g", script)
	require.Equal(t, messages.StateSucceeded, st.State, "reason %q, stderr %s", st.Reason, out.stderr)
	require.Contains(t, string(out.stdout), `\"run_id\":\"gv-bridge\"`, "status answered through the host socket; stderr %s", out.stderr)
	require.NotContains(t, string(out.stdout), "coordination unavailable")
	require.Equal(t, "available", st.Coordination)
}

// gvisorNetwork: under "runsc" (--network=none) a profile's network is not
// used at all: a bridge profile still sees only gVisor's loopback. Under
// "runsc-net" the same profile gets Docker's interface and default route (no
// traffic is sent).
func gvisorNetwork(t *testing.T, b *jailBundle) {
	probe := `echo "ifaces=$(ls /sys/class/net | tr '\n' ,)"
echo "routes=$(tail -n +2 /proc/net/route | awk '{print $1":"$2}' | tr '\n' ,)"`
	st, out := b.runScript(t, "gv-bridge-net", "gbridge", probe)
	require.Equal(t, messages.StateSucceeded, st.State, "reason %q, stderr %s", st.Reason, out.stderr)
	v := values(out.stdout)
	require.Equal(t, "lo,", v["ifaces"], "runsc --network=none ignores the container's network")
	require.Equal(t, "", v["routes"])

	requireGVisorNet(t)
	st, out = b.runScript(t, "gv-net-bridge", "gnet", probe)
	require.Equal(t, messages.StateSucceeded, st.State, "reason %q, stderr %s", st.Reason, out.stderr)
	v = values(out.stdout)
	require.Equal(t, "eth0,lo,", v["ifaces"], "runsc-net: Docker's interface")
	require.Contains(t, v["routes"], "eth0:00000000", "a default route")
	require.Equal(t, gvisorNetRuntime, st.Receipt.Runtime)
}

// TestOCIRuntimeCheckAtStart: with the real Docker runtime, a worker whose
// profile names a runtime the engine lacks refuses to start, naming the
// profile, the runtime and what the engine offers (read from the engine).
func TestOCIRuntimeCheckAtStart(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	rt, cli := jailDocker(t)
	info, err := cli.Info(context.Background())
	require.NoError(t, err)
	have := slices.Sorted(maps.Keys(info.Runtimes))

	profiles, err := profile.ParseProfiles(t.Name(), []byte(jailProfile("nope", `runtime = "jetcrew-no-such-runtime"`)))
	require.NoError(t, err)
	s := workertest.StartServer(t)
	w, err := worker.New(workertest.Connect(t, s), worker.Config{ID: "jt-" + randomHex(t), Runtime: rt, Profiles: profiles,
		BridgePath: jailBridge, StateDir: workertest.StateDir(t)})
	require.NoError(t, err)
	err = w.Start(context.Background())
	require.ErrorIs(t, err, profile.ErrOCIRuntimeMissing)
	require.ErrorContains(t, err, `profile "nope" names runtime "jetcrew-no-such-runtime"; the engine offers: `+strings.Join(have, ", "))
}

// TestGVisorNamedNetwork: egress under gVisor. On an --internal network the
// test creates, a "runsc-net" run reaches a peer on that network; the host's
// loopback is not the run's. Traffic goes only to the test's network.
func TestGVisorNamedNetwork(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	requireGVisor(t)
	requireGVisorNet(t)
	_, cli := jailDocker(t)
	ctx := context.Background()
	netName := "jetcrew-test-gv-" + randomHex(t)
	created, err := cli.NetworkCreate(ctx, netName, dockernet.CreateOptions{Driver: "bridge", Internal: true,
		Labels: map[string]string{"io.jetcrew.test": "jail"}})
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := cli.NetworkRemove(context.Background(), created.ID); err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("remove network %s: %v", netName, err)
		}
	})
	peer := startPeer(t, cli, netName)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	loPort := l.Addr().(*net.TCPAddr).Port

	b := startJail(t, jailProfile("gvnet", fmt.Sprintf("runtime = %q\nnetwork = %q", gvisorNetRuntime, netName)), nil)
	st, out := b.runScript(t, "gv-named", "gvnet", fmt.Sprintf(`
r=failed; for i in 1 2 3 4 5; do if echo | nc -w 2 %s 8080 2>/dev/null | grep -q pong; then r=connected; break; fi; usleep 200000; done; echo "peer=$r"
if echo | nc -w 2 127.0.0.1 %d 2>/dev/null; then echo lo=connected; else echo lo=failed; fi
echo "kernel=$(uname -r)"`, peer, loPort))
	require.Equal(t, messages.StateSucceeded, st.State, "reason %q, stderr %s", st.Reason, out.stderr)
	v := values(out.stdout)
	require.Equal(t, "connected", v["peer"], "the peer on the run's network answers")
	require.Equal(t, "failed", v["lo"], "the host's loopback is not the run's")
	require.Equal(t, "4.4.0", v["kernel"], "still gVisor's kernel")
}

// gvisorTmpfs: /tmp and HOME stop at exactly their sizes (gVisor's own tmpfs).
func gvisorTmpfs(t *testing.T, b *jailBundle) {
	st, out := b.runScript(t, "gv-tmpfull", "gsmall", `
cat /dev/zero >"$HOME/fill" 2>/dev/null; echo "home_rc=$? home_size=$(wc -c <"$HOME/fill")"
cat /dev/zero >/tmp/fill 2>/dev/null; echo "tmp_rc=$? tmp_size=$(wc -c </tmp/fill)"`)
	require.Equal(t, messages.StateSucceeded, st.State, "reason %q, stderr %s", st.Reason, out.stderr)
	v := values(out.stdout)
	require.Equal(t, "1", v["home_rc"])
	require.Equal(t, "1", v["tmp_rc"])
	require.Equal(t, strconv.Itoa(2<<20), v["home_size"], "HOME stops at home_mib (gVisor's own tmpfs)")
	require.Equal(t, strconv.Itoa(1<<20), v["tmp_size"], "/tmp stops at tmp_mib (gVisor's own tmpfs)")
}

// gvisorNetworkNone: only gVisor's loopback, no route, no TCP connection.
func gvisorNetworkNone(t *testing.T, b *jailBundle) {
	st, out := b.runScript(t, "gv-net", "g", `echo "ifaces=$(ls /sys/class/net | tr '\n' ,)"
echo "routes=$(tail -n +2 /proc/net/route | awk '{print $1":"$2}' | tr '\n' ,)"
if echo | nc -w 2 127.0.0.1 1 2>/dev/null; then echo tcp=connected; else echo tcp=failed; fi`)
	require.Equal(t, messages.StateSucceeded, st.State, "reason %q, stderr %s", st.Reason, out.stderr)
	v := values(out.stdout)
	require.Equal(t, "lo,", v["ifaces"], "only gVisor's loopback")
	require.Equal(t, "", v["routes"], "no route at all")
	require.Equal(t, "failed", v["tcp"])
}

// gvisorWorkspace: under gVisor a workspace run's snapshot streams into
// the run as it downloads: the in-jail exec follows the growing host file
// (a sandbox may cache its length: it opens it again when it grew),
// waits for the worker's checked file, and the agent sees the whole tree;
// the capture, its snapshot preloaded while the agent ran, records the
// run's change within the capture container's memory (its Go heap kept
// under GOMEMLIMIT: without, it was OOM killed at this size under gVisor).
func gvisorWorkspace(t *testing.T, b *jailBundle) {
	dir := t.TempDir()
	blob := make([]byte, 24<<20) // enough to arrive in many chunks
	for i := range blob {
		blob[i] = byte('a' + i%26)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "blob.txt"), blob, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "in.txt"), []byte("in\n"), 0o644))
	wsb, _, err := workspace.EnsureBuckets(context.Background(), b.js, workspace.BucketConfig{})
	require.NoError(t, err)
	up, err := workspace.Upload(context.Background(), wsb, dir, workspace.SnapshotOptions{})
	require.NoError(t, err)
	b.submitRequest(t, messages.RunRequest{ID: "gv-ws", Profile: "gws", Timeout: messages.Duration(time.Minute), Workspace: &up.Ref,
		Prompt: "cat in.txt; wc -c < blob.txt; echo out > out.txt; sleep 1"})
	st := b.waitFinal(t, "gv-ws")
	out := b.output(t, "gv-ws")
	require.Equal(t, messages.StateSucceeded, st.State, "%s: %s", st.Reason, out.stderr)
	require.Equal(t, fmt.Sprintf("in\n%d\n", len(blob)), string(out.stdout))
	require.NotNil(t, st.WorkspaceResult)
	require.Empty(t, st.WorkspaceResult.Error)
	require.Equal(t, 1, st.WorkspaceResult.FilesChanged)
}
