package tests

// Warm containers (issue 25, worker/warm), proven on a real Docker engine.
//
// Most tests drive the real worker in-process (startJail: worker.New with
// the Docker runtime, a fresh nats-server, jetcrew-bridge as the launcher
// and bridge) with a profile that keeps warm containers; the kill -9 test
// runs the real `jetcrew worker` binary, as crash_test.go does. The fake
// runtime's tests of the same promises are in worker/warm_test.go; these
// show that they hold with real containers: what the jailed process
// measures from inside, what `docker inspect` shows, what `docker ps -a`
// still lists.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/warm"
	"github.com/jetcrew/jetcrew/worker/workertest"
	"github.com/jetcrew/jetcrew/workspace"
)

// warmRuntime wraps the jail tests' recording runtime for the warm tests.
// It keeps the engine's view of every container right after its start by
// container id (a warm container carries no run id label, so
// recordingRuntime's record by run id misses it), and it may limit how
// many warm containers the pool gets to start: past the limit a warm
// start blocks until the pool stops, so a later run of the profile finds
// none ready and starts cold, deterministically.
type warmRuntime struct {
	jail.Runtime
	cli *client.Client
	// images answers the pool's image checks (warm.ImageLister), as the
	// Docker runtime the worker is given answers them.
	images warm.ImageLister

	mu sync.Mutex
	// warmLeft is how many more warm containers may start; negative: no
	// limit. wake is closed (and replaced) when allowWarm raises it.
	warmLeft int
	wake     chan struct{}
	inspects map[string]container.InspectResponse // by container id
	order    []string                             // container ids, in start order
}

func (r *warmRuntime) Start(ctx context.Context, spec jail.ContainerSpec, out jail.OutputFunc) (jail.Container, error) {
	for spec.Labels[jail.LabelRole] == jail.RoleWarm {
		r.mu.Lock()
		if r.warmLeft != 0 {
			if r.warmLeft > 0 {
				r.warmLeft--
			}
			r.mu.Unlock()
			break
		}
		wake := r.wake
		r.mu.Unlock()
		select {
		case <-ctx.Done(): // the pool's Stop
			return nil, ctx.Err()
		case <-wake:
		}
	}
	c, err := r.Runtime.Start(ctx, spec, out)
	if err != nil {
		return nil, err
	}
	if info, err := r.cli.ContainerInspect(ctx, c.ID()); err == nil {
		r.mu.Lock()
		r.inspects[c.ID()] = info
		r.order = append(r.order, c.ID())
		r.mu.Unlock()
	}
	return c, nil
}

// ImageID implements warm.ImageLister: the engine's id of image ref now.
func (r *warmRuntime) ImageID(ctx context.Context, ref string) (string, error) {
	return r.images.ImageID(ctx, ref)
}

// allowWarm lets the pool start n more warm containers.
func (r *warmRuntime) allowWarm(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.warmLeft += n
	close(r.wake)
	r.wake = make(chan struct{})
}

// inspect returns the engine's view of container id right after its start.
func (r *warmRuntime) inspect(t *testing.T, id string) container.InspectResponse {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	info, ok := r.inspects[id]
	require.True(t, ok, "container %s was not started through the worker's runtime", id)
	return info
}

// warmIDs returns the ids of the warm containers started so far, in start
// order.
func (r *warmRuntime) warmIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for _, id := range r.order {
		if r.inspects[id].Config.Labels[jail.LabelRole] == jail.RoleWarm {
			ids = append(ids, id)
		}
	}
	return ids
}

// startWarm starts startJail's worker on a warmRuntime that lets the pool
// start at most warmLimit warm containers (negative: any number).
func startWarm(t *testing.T, profilesTOML string, warmLimit int, mod func(*worker.Config)) (*jailBundle, *warmRuntime) {
	t.Helper()
	rt, cli := jailDocker(t)
	var wr *warmRuntime
	b := startJail(t, profilesTOML, func(c *worker.Config) {
		wr = &warmRuntime{Runtime: c.Runtime, cli: cli, images: rt, warmLeft: warmLimit, wake: make(chan struct{}), inspects: map[string]container.InspectResponse{}}
		c.Runtime = wr
		if mod != nil {
			mod(c)
		}
	})
	return b, wr
}

// warmReady waits until the worker's only warm pool holds n ready
// containers.
func warmReady(t *testing.T, b *jailBundle, n int) {
	t.Helper()
	var ws []messages.WarmPool
	require.Eventually(t, func() bool {
		ws = b.w.WarmStatus()
		return len(ws) == 1 && ws[0].Ready == n
	}, time.Minute, 10*time.Millisecond, "the warm pool never held %d ready containers: %+v", n, ws)
}

// warmCount returns the sum of the series of the worker's counter name
// (jetcrew_warm_claimed_total, _missed_total, _replaced_total).
func warmCount(t *testing.T, b *jailBundle, name string) float64 {
	t.Helper()
	mfs, err := b.w.Registry().Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// submitRequest publishes req on the default pool, as any NATS client
// would.
func (b *jailBundle) submitRequest(t *testing.T, req messages.RunRequest) {
	t.Helper()
	data, err := json.Marshal(req)
	require.NoError(t, err)
	_, err = b.js.Publish(context.Background(), messages.SubjectRuns(messages.DefaultPool), data, jetstream.WithMsgID(req.ID))
	require.NoError(t, err)
}

// runEvent returns run id's event of type typ (polled for: the finished
// event follows the final state), failing the test when it never comes.
func runEvent(t *testing.T, b *jailBundle, id string, typ messages.EventType) messages.Event {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range b.events(t, id) {
			if m.Subject() == messages.SubjectEvents(id, typ) {
				var ev messages.Event
				require.NoError(t, json.Unmarshal(m.Data(), &ev))
				return ev
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("run %s has no %s event", id, typ)
	return messages.Event{}
}

// hasEvent reports whether run id has an event of type typ now.
func hasEvent(t *testing.T, b *jailBundle, id string, typ messages.EventType) bool {
	t.Helper()
	for _, m := range b.events(t, id) {
		if m.Subject() == messages.SubjectEvents(id, typ) {
			return true
		}
	}
	return false
}

// containerGone reports whether the engine no longer knows container id
// (`docker ps -a` would not list it).
func containerGone(t *testing.T, cli *client.Client, id string) bool {
	t.Helper()
	_, err := cli.ContainerInspect(context.Background(), id)
	if err != nil {
		require.True(t, cerrdefs.IsNotFound(err), "inspect %s: %v", id, err)
		return true
	}
	return false
}

// warmNameRE matches a warm container's name: jetcrew-warm-<hex>-<worker>.
func warmNameRE(workerID string) *regexp.Regexp {
	return regexp.MustCompile(`^/?jetcrew-warm-[0-9a-f]{16}-` + regexp.QuoteMeta(workerID) + `$`)
}

// jailProbe prints, as key=value words, the facts of the jail the process
// measures from inside: TestJailIdentity's ids, capabilities,
// no-new-privileges, seccomp and cgroup limits, TestJailFilesystem's
// read-only root, TestJailNetwork's interfaces and routes, and one
// "mount=<point>:<options>" line per mount of /proc/self/mountinfo. It
// exits 0.
const jailProbe = `
grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status | tr -d ' ' | tr '\t' '='
for f in pids.max pids/pids.max memory.max memory/memory.limit_in_bytes memory.swap.max memory/memory.memsw.limit_in_bytes cpu.max cpu/cpu.cfs_quota_us cpu/cpu.cfs_period_us; do
  [ -r /sys/fs/cgroup/$f ] && echo "cg:$f=$(cat /sys/fs/cgroup/$f | tr ' ' _)"
done
if touch /probe 2>/dev/null; then echo root=writable; else echo root=read-only; fi
echo x >/tmp/probe && echo tmp=writable
echo "ifaces=$(ls /sys/class/net | tr '\n' ,)"
echo "routes=$(tail -n +2 /proc/net/route | awk '{print $1":"$2}' | tr '\n' ,)"
echo "home=$HOME cwd=$(pwd) nofile=$(ulimit -n)"
awk '{print "mount=" $5 ":" $6}' /proc/self/mountinfo
exit 0`

// probeFacts returns the probe's facts (every key=value word but the
// mounts) and its mounts, sorted.
func probeFacts(out []byte) (map[string]string, []string) {
	v := values(out)
	delete(v, "mount")
	var mounts []string
	for _, l := range strings.Split(string(out), "\n") {
		if m, ok := strings.CutPrefix(l, "mount="); ok {
			mounts = append(mounts, m)
		}
	}
	sort.Strings(mounts)
	return v, mounts
}

// TestWarmColdSameJail: a warm run and a cold run of one profile, side by
// side on one worker, get the same jail. The non-root process measures the
// same facts from inside (uid and gid, no capabilities, no-new-privileges,
// seccomp, the cgroup limits, a read-only root, loopback only and no
// route, the same mounts with the same options); their receipts are the
// same but for warm (hardening, limits, argv, env names, mounts by role
// and digest, image id); the state, receipt and started and finished
// events of the warm one say warm, the cold one's do not. A workspace run
// of the same profile starts cold (the profile keeps no containers for
// workspace runs: warm_workspace, TestWarmWorkspaceSameAsCold) and leaves
// the warm container to the next run.
func TestWarmColdSameJail(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	// One warm container only: the second run finds none ready.
	b, wr := startWarm(t, jailProfile("hot", `user = "4242:4343"
memory_mib = 96
cpus = 0.5
pids = 77
warm = 1`), 1, nil)
	warmReady(t, b, 1)
	warmID := wr.warmIDs()[0]

	// A workspace run: cold, whatever the pool holds.
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "in.txt"), []byte("in\n"), 0o644))
	wsb, _, err := workspace.EnsureBuckets(context.Background(), b.js, workspace.BucketConfig{})
	require.NoError(t, err)
	up, err := workspace.Upload(context.Background(), wsb, dir, workspace.SnapshotOptions{})
	require.NoError(t, err)
	b.submitRequest(t, messages.RunRequest{ID: "ws", Profile: "hot", Prompt: `cat in.txt; echo out >out.txt`,
		Timeout: messages.Duration(time.Minute), Workspace: &up.Ref})
	ws := b.waitFinal(t, "ws")
	require.Equal(t, messages.StateSucceeded, ws.State, ws.Reason)
	require.Equal(t, "in\n", string(b.output(t, "ws").stdout), "the agent saw the workspace")
	require.False(t, ws.Warm, "a workspace run starts cold")
	require.False(t, ws.Receipt.Warm)
	require.NotEqual(t, warmID, ws.ContainerID)
	require.Equal(t, jail.RoleRun, wr.inspect(t, ws.ContainerID).Config.Labels[jail.LabelRole])
	require.NotNil(t, ws.WorkspaceResult)
	require.Empty(t, ws.WorkspaceResult.Error)
	require.Equal(t, 1, ws.WorkspaceResult.FilesChanged)
	require.Zero(t, warmCount(t, b, "jetcrew_warm_claimed_total"), "the workspace run claimed no warm container")
	require.Zero(t, warmCount(t, b, "jetcrew_warm_missed_total"), "nor looked for one")
	warmReady(t, b, 1)
	require.False(t, containerGone(t, b.cli, warmID), "the warm container still waits")

	// The warm run takes the one warm container; the cold run finds none.
	warm, warmOut := b.runScript(t, "warm", "hot", jailProbe)
	require.Equal(t, messages.StateSucceeded, warm.State, "reason %q, stderr %s", warm.Reason, warmOut.stderr)
	cold, coldOut := b.runScript(t, "cold", "hot", jailProbe)
	require.Equal(t, messages.StateSucceeded, cold.State, "reason %q, stderr %s", cold.Reason, coldOut.stderr)
	require.True(t, warm.Warm)
	require.Equal(t, warmID, warm.ContainerID, "the warm run ran in the pool's container")
	require.False(t, cold.Warm)
	require.EqualValues(t, 1, warmCount(t, b, "jetcrew_warm_claimed_total"))
	require.EqualValues(t, 1, warmCount(t, b, "jetcrew_warm_missed_total"))
	require.Equal(t, jail.RoleWarm, wr.inspect(t, warm.ContainerID).Config.Labels[jail.LabelRole])
	require.Equal(t, jail.RoleRun, wr.inspect(t, cold.ContainerID).Config.Labels[jail.LabelRole])

	// The same jail, as the process sees it.
	wv, wm := probeFacts(warmOut.stdout)
	cv, cm := probeFacts(coldOut.stdout)
	t.Logf("warm facts: %v", wv)
	require.Equal(t, cv, wv, "the jail's facts from inside, warm vs cold")
	require.Equal(t, cm, wm, "the mounts from inside, warm vs cold")
	require.Equal(t, "4242=4242=4242=4242", wv["Uid:"])
	require.Equal(t, "4343=4343=4343=4343", wv["Gid:"])
	for _, c := range []string{"CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"} {
		require.Equal(t, "0000000000000000", wv[c], c)
	}
	require.Equal(t, "1", wv["NoNewPrivs:"])
	require.Equal(t, "2", wv["Seccomp:"])
	require.Equal(t, "read-only", wv["root"])
	require.Equal(t, "writable", wv["tmp"])
	require.Equal(t, "lo,", wv["ifaces"], "loopback only")
	require.Equal(t, "", wv["routes"], "no route at all")
	cg := func(names ...string) string {
		for _, n := range names {
			if x, ok := wv["cg:"+n]; ok {
				return x
			}
		}
		t.Fatalf("none of %v in the warm run's output:\n%s", names, warmOut.stdout)
		return ""
	}
	require.Equal(t, "77", cg("pids.max", "pids/pids.max"))
	require.Equal(t, strconv.Itoa(96<<20), cg("memory.max", "memory/memory.limit_in_bytes"))
	require.Contains(t, strings.Split(mountOpts(t, wm, "/"), ","), "ro", "root mounted read-only")

	// The same receipt, but for warm: mounts by role and digest, limits,
	// hardening, argv, environment names.
	require.True(t, warm.Receipt.Warm)
	require.False(t, cold.Receipt.Warm)
	require.NotEmpty(t, warm.Receipt.Mounts)
	require.NotEmpty(t, warm.Receipt.ImageID)
	coldReceipt := cold.Receipt
	coldReceipt.Warm = true
	require.Equal(t, coldReceipt, warm.Receipt, "the warm run's receipt is the cold run's plus warm")

	// The state, the started and the finished event say which is which.
	require.True(t, runEvent(t, b, "warm", messages.EventStarted).Warm)
	require.True(t, runEvent(t, b, "warm", messages.EventFinished).Warm)
	require.False(t, runEvent(t, b, "cold", messages.EventStarted).Warm)
	require.False(t, runEvent(t, b, "cold", messages.EventFinished).Warm)
	require.Equal(t, warm.ContainerID, runEvent(t, b, "warm", messages.EventStarted).ContainerID)
}

// TestWarmWorkspaceSameAsCold: two workspace runs of a profile that keeps
// one warm container for workspace runs (warm_workspace = 1), the first
// warm, the second cold (the pool may make no second container): each
// agent sees the snapshot's tree in /workspace, unpacked by the launcher's
// in-jail exec, its change is captured the same way, the jail's facts and
// mounts from inside are the same, and the receipts are the same but for
// warm. The warm container was made with its own empty workspace volume
// (`docker inspect`: a tmpfs volume of the profile's workspace_mib at
// /workspace), which goes with its run.
func TestWarmWorkspaceSameAsCold(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	b, wr := startWarm(t, jailProfile("hotws", `user = "4242:4343"
memory_mib = 192
workspace_mib = 24
warm_workspace = 1`), 1, nil)
	warmReady(t, b, 1)
	warmID := wr.warmIDs()[0]
	info := wr.inspect(t, warmID)
	var vol string
	for _, m := range info.Mounts {
		if m.Destination == messages.WorkspaceDir {
			vol = m.Name
			require.True(t, m.RW)
		}
	}
	require.NotEmpty(t, vol, "the warm container has its workspace volume: %+v", info.Mounts)

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "in.txt"), []byte("in\n"), 0o644))
	wsb, _, err := workspace.EnsureBuckets(context.Background(), b.js, workspace.BucketConfig{})
	require.NoError(t, err)
	up, err := workspace.Upload(context.Background(), wsb, dir, workspace.SnapshotOptions{})
	require.NoError(t, err)
	states := map[string]messages.RunState{}
	outs := map[string]runOutput{}
	for _, id := range []string{"ws-warm", "ws-cold"} {
		b.submitRequest(t, messages.RunRequest{ID: id, Profile: "hotws", Prompt: "cat in.txt; echo out >out.txt; echo cwd=$(pwd)\n" + jailProbe,
			Timeout: messages.Duration(time.Minute), Workspace: &up.Ref})
		st := b.waitFinal(t, id)
		out := b.output(t, id)
		require.Equal(t, messages.StateSucceeded, st.State, "reason %q, stderr %s", st.Reason, out.stderr)
		require.True(t, strings.HasPrefix(string(out.stdout), "in\n"), "the agent saw the workspace: %s", out.stdout)
		require.NotNil(t, st.WorkspaceResult)
		require.Empty(t, st.WorkspaceResult.Error)
		require.Equal(t, 1, st.WorkspaceResult.FilesChanged)
		require.Len(t, st.WorkspaceResult.Objects, 2, "patch and bundle")
		states[id], outs[id] = st, out
	}
	warm, cold := states["ws-warm"], states["ws-cold"]
	require.True(t, warm.Warm)
	require.Equal(t, warmID, warm.ContainerID, "the warm run ran in the pool's container")
	require.False(t, cold.Warm)
	require.EqualValues(t, 1, warmCount(t, b, "jetcrew_warm_claimed_total"))
	require.EqualValues(t, 1, warmCount(t, b, "jetcrew_warm_missed_total"))

	wv, wm := probeFacts(outs["ws-warm"].stdout)
	cv, cm := probeFacts(outs["ws-cold"].stdout)
	require.Equal(t, cv, wv, "the jail's facts from inside, warm vs cold")
	require.Equal(t, cm, wm, "the mounts from inside, warm vs cold")
	require.Equal(t, "/workspace", wv["cwd"])
	require.Contains(t, strings.Split(mountOpts(t, wm, messages.WorkspaceDir), ","), "rw")
	require.Contains(t, strings.Split(mountOpts(t, wm, "/run/jetcrew-ws/in"), ","), "ro")

	require.True(t, warm.Receipt.Warm)
	coldReceipt := cold.Receipt
	coldReceipt.Warm = true
	require.Equal(t, coldReceipt, warm.Receipt, "the warm workspace run's receipt is the cold one's plus warm")
	require.Eventually(t, func() bool {
		_, err := b.cli.VolumeInspect(context.Background(), vol)
		return cerrdefs.IsNotFound(err)
	}, 30*time.Second, 100*time.Millisecond, "the warm container's volume went with its run")
}

// mountOpts returns the options of the mount at point among probeFacts'
// mounts.
func mountOpts(t *testing.T, mounts []string, point string) string {
	t.Helper()
	var opts string
	found := false
	for _, m := range mounts {
		if p, o, ok := strings.Cut(m, ":"); ok && p == point {
			opts, found = o, true
		}
	}
	require.True(t, found, "no mount at %s: %v", point, mounts)
	return opts
}

// TestWarmTenRunsTenContainers: ten runs on a pool of two, two at a time,
// each started warm, use ten different containers, each a warm container
// of this worker (its name, role label, no run id label), each removed
// after its run (`docker ps -a` by id lists none); no run sees what an
// earlier one left in /tmp; the pool is full again afterwards with two
// more new containers.
func TestWarmTenRunsTenContainers(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	b, wr := startWarm(t, jailProfile("hot", "warm = 2"), -1, nil)
	nameRE := warmNameRE(b.workerID)

	const script = `echo "tmp=$(ls -A /tmp | tr '\n' ,) run=$JETCREW_RUN_ID"; touch /tmp/left-by-$JETCREW_RUN_ID`
	var ids []string
	for round := range 5 {
		warmReady(t, b, 2)
		pair := []string{fmt.Sprintf("ten-%d-a", round), fmt.Sprintf("ten-%d-b", round)}
		for _, id := range pair {
			b.submit(t, id, "hot", script, time.Minute)
		}
		for _, id := range pair {
			st := b.waitFinal(t, id)
			require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
			require.True(t, st.Warm, "run %s started warm", id)
			v := values(b.output(t, id).stdout)
			require.Equal(t, "", v["tmp"], "run %s: nothing of an earlier run in /tmp", id)
			require.Equal(t, id, v["run"])
			info := wr.inspect(t, st.ContainerID)
			require.Regexp(t, nameRE, info.Name)
			require.Equal(t, jail.RoleWarm, info.Config.Labels[jail.LabelRole])
			require.NotContains(t, info.Config.Labels, jail.LabelRunID, "a warm container has no run id label")
			ids = append(ids, st.ContainerID)
		}
	}
	distinct := slices.Clone(ids)
	slices.Sort(distinct)
	require.Len(t, slices.Compact(distinct), 10, "one container, one run: %v", ids)
	require.EqualValues(t, 10, warmCount(t, b, "jetcrew_warm_claimed_total"))
	require.Zero(t, warmCount(t, b, "jetcrew_warm_missed_total"))

	// Each run's container went with it (`docker ps -a` by id).
	require.Eventually(t, func() bool {
		args := []string{"ps", "-a", "-q", "--no-trunc"}
		for _, id := range ids {
			args = append(args, "--filter", "id="+id)
		}
		out, err := exec.Command("docker", args...).Output()
		require.NoError(t, err)
		return strings.TrimSpace(string(out)) == ""
	}, 30*time.Second, 100*time.Millisecond, "the runs' containers are removed")

	// The pool refilled with two more, new containers.
	warmReady(t, b, 2)
	all := wr.warmIDs()
	require.Len(t, all, 12, "ten claimed, two waiting: no warm container made for nothing")
	for _, id := range all[10:] {
		require.NotContains(t, ids, id)
	}
}

// TestWarmSecretNotInInspect: a secret from the worker's environment
// (env_from_host) is in the agent's environment, warm and cold (the agent
// prints its hash; its value is masked in the output), and in no part of
// `docker inspect` of the run's container: not its Config.Env, Cmd,
// Entrypoint or Labels, not its HostConfig, nowhere in the whole
// document. The warm container's configuration is the launcher's: its
// command is `launch --handoff`, its environment HOME alone.
func TestWarmSecretNotInInspect(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	const secret = "sk-warm-5d1e9b07c3"
	sum := sha256.Sum256([]byte(secret))
	b, wr := startWarm(t, jailProfile("keyed", "warm = 1\nenv_from_host = [\"KEY\"]"), 1, func(c *worker.Config) {
		c.LookupEnv = func(k string) (string, bool) {
			if k == "KEY" {
				return secret, true
			}
			return "", false
		}
	})
	warmReady(t, b, 1)

	const script = `echo "hash=$(printf %s "$KEY" | sha256sum | cut -d' ' -f1) value=$KEY"`
	for _, c := range []struct {
		id   string
		warm bool
	}{{"secret-warm", true}, {"secret-cold", false}} {
		st, out := b.runScript(t, c.id, "keyed", script)
		require.Equal(t, messages.StateSucceeded, st.State, "reason %q, stderr %s", st.Reason, out.stderr)
		require.Equal(t, c.warm, st.Warm, c.id)
		v := values(out.stdout)
		require.Equal(t, hex.EncodeToString(sum[:]), v["hash"], "%s: the secret is in the agent's environment", c.id)
		require.Equal(t, "***", v["value"], "%s: masked in the output", c.id)
		require.Contains(t, st.Receipt.EnvNames, "KEY", "the receipt names the secret, not its value")

		info := wr.inspect(t, st.ContainerID)
		parts := map[string]any{
			"Config.Env": info.Config.Env, "Config.Cmd": info.Config.Cmd, "Config.Entrypoint": info.Config.Entrypoint,
			"Config.Labels": info.Config.Labels, "HostConfig": info.HostConfig, "the whole inspect": info,
		}
		for name, part := range parts {
			data, err := json.Marshal(part)
			require.NoError(t, err)
			require.NotContains(t, string(data), secret, "%s: the secret in docker inspect's %s", c.id, name)
			require.NotContains(t, string(data), secret[3:], "%s: part of the secret in docker inspect's %s", c.id, name)
		}
		for _, e := range info.Config.Env {
			require.False(t, strings.HasPrefix(e, "KEY="), "%s: the secret's variable is in Config.Env", c.id)
		}
		if c.warm {
			require.Equal(t, []string{messages.ContainerBridgePath, "launch", "--handoff", messages.ContainerHandoffPath}, []string(info.Config.Cmd))
			// HOME, and what the image itself sets.
			img, err := b.cli.ImageInspect(context.Background(), info.Image)
			require.NoError(t, err)
			for _, e := range info.Config.Env {
				require.True(t, strings.HasPrefix(e, "HOME=") || slices.Contains(img.Config.Env, e),
					"a warm container's environment is HOME and the image's: %v", info.Config.Env)
			}
		} else {
			require.Equal(t, jail.RoleRun, info.Config.Labels[jail.LabelRole])
		}
		require.Eventually(t, func() bool { return containerGone(t, b.cli, st.ContainerID) }, 30*time.Second, 50*time.Millisecond,
			"%s: the container is removed after its run", c.id)
	}
}

// TestWarmContainerKilledIsReplaced: a warm container killed from outside
// (`docker kill`) while it waits is counted replaced
// (jetcrew_warm_replaced_total), removed, and a new one, under a new name,
// takes its place; the next run starts warm in the new one and succeeds.
// One killed after a run claimed it, before its hand-off (the run held at
// the before-start point, in-process), is never handed that run either:
// the run starts cold in a container of its own and succeeds, and the
// dead one is counted replaced and removed.
func TestWarmContainerKilledIsReplaced(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	var hold atomic.Pointer[chan struct{}] // non-nil: the next run waits at its start
	reached := make(chan struct{}, 1)
	b, wr := startWarm(t, jailProfile("hot", "warm = 1"), -1, func(c *worker.Config) {
		c.Failpoint = func(name string) {
			if name != stage.FailpointBeforeStart {
				return
			}
			if open := hold.Load(); open != nil {
				reached <- struct{}{}
				<-*open
			}
		}
	})
	ctx := context.Background()
	nameRE := warmNameRE(b.workerID)

	warmReady(t, b, 1)
	killed := wr.warmIDs()[0]
	require.NoError(t, b.cli.ContainerKill(ctx, killed, "KILL"))
	require.Eventually(t, func() bool { return warmCount(t, b, "jetcrew_warm_replaced_total") == 1 }, 30*time.Second, 20*time.Millisecond,
		"the dead warm container is counted replaced")
	require.Eventually(t, func() bool { return containerGone(t, b.cli, killed) }, 30*time.Second, 50*time.Millisecond,
		"and removed")
	warmReady(t, b, 1)
	ids := wr.warmIDs()
	require.Len(t, ids, 2)
	replacement := ids[1]
	require.Regexp(t, nameRE, wr.inspect(t, replacement).Name)
	require.NotEqual(t, wr.inspect(t, killed).Name, wr.inspect(t, replacement).Name, "a new container, under a new name")

	st, out := b.runScript(t, "after-kill", "hot", `echo ok`)
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.Equal(t, "ok\n", string(out.stdout))
	require.True(t, st.Warm)
	require.Equal(t, replacement, st.ContainerID, "the run took the replacement, not the killed container")
	require.EqualValues(t, 1, warmCount(t, b, "jetcrew_warm_claimed_total"))

	// Killed once a run claimed it, before the hand-off.
	warmReady(t, b, 1)
	ids = wr.warmIDs()
	claimed := ids[len(ids)-1]
	open := make(chan struct{})
	hold.Store(&open)
	b.submit(t, "killed-when-claimed", "hot", `echo ok`, time.Minute)
	select {
	case <-reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the run never reached its start")
	}
	hold.Store(nil)
	require.NoError(t, b.cli.ContainerKill(ctx, claimed, "KILL"))
	require.Eventually(t, func() bool {
		info, err := b.cli.ContainerInspect(ctx, claimed)
		return err == nil && !info.State.Running
	}, 30*time.Second, 20*time.Millisecond, "the claimed container is dead")
	close(open)
	st = b.waitFinal(t, "killed-when-claimed")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.Equal(t, "ok\n", string(b.output(t, "killed-when-claimed").stdout))
	require.False(t, st.Warm, "started cold")
	require.NotEqual(t, claimed, st.ContainerID, "the dead container was never handed the run")
	require.Equal(t, jail.RoleRun, wr.inspect(t, st.ContainerID).Config.Labels[jail.LabelRole])
	require.EqualValues(t, 2, warmCount(t, b, "jetcrew_warm_replaced_total"), "the dead claimed container is counted replaced")
	require.EqualValues(t, 1, warmCount(t, b, "jetcrew_warm_claimed_total"), "and no warm start")
	require.Eventually(t, func() bool { return containerGone(t, b.cli, claimed) }, 30*time.Second, 50*time.Millisecond)
}

// TestWarmCancelWhileClaiming: a run cancelled after it claimed a warm
// container and before its start was decided (held at the before-start
// point, in-process) is answered "will not run", ends cancelled, and its
// agent never starts: no started event, no output, the warm container it
// claimed removed unused, no warm start counted
// (jetcrew_warm_claimed_total counts the warm starts); the pool makes
// another.
func TestWarmCancelWhileClaiming(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	reached, open := make(chan struct{}), make(chan struct{})
	var once sync.Once
	// The pool makes one container until the test allows another, so the
	// claim shows in the pool's ready count.
	b, wr := startWarm(t, jailProfile("hot", "warm = 1"), 1, func(c *worker.Config) {
		c.Failpoint = func(name string) {
			if name == stage.FailpointBeforeStart {
				once.Do(func() { close(reached) })
				<-open
			}
		}
	})
	warmReady(t, b, 1)
	claimed := wr.warmIDs()[0]

	b.submit(t, "cancel-me", "hot", `echo AGENT-STARTED; sleep 30`, time.Minute)
	select {
	case <-reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the run never reached its start")
	}
	require.Equal(t, 0, b.w.WarmStatus()[0].Ready, "the run holds the warm container")
	require.False(t, containerGone(t, b.cli, claimed))
	resp, err := b.nc.Request(messages.SubjectCancel("cancel-me"), nil, 10*time.Second)
	require.NoError(t, err)
	var r messages.CancelReply
	require.NoError(t, json.Unmarshal(resp.Data, &r))
	require.Equal(t, messages.CancelQueued, r.Result, r.Message)
	require.Contains(t, r.Message, "will not run")
	close(open)

	st := b.waitFinal(t, "cancel-me")
	require.Equal(t, messages.StateCancelled, st.State)
	require.Equal(t, "cancelled by request before its container started", st.Reason)
	require.False(t, st.Warm)
	require.Nil(t, st.ExitCode, "nothing ran")
	require.Eventually(t, func() bool { return containerGone(t, b.cli, claimed) }, 30*time.Second, 50*time.Millisecond,
		"the claimed warm container is removed unused")
	out := b.output(t, "cancel-me")
	require.Empty(t, out.stdout, "the agent never started")
	require.Empty(t, out.stderr)
	require.False(t, hasEvent(t, b, "cancel-me", messages.EventStarted), "no started event")
	for _, id := range wr.warmIDs() {
		require.NotEqual(t, jail.RoleRun, wr.inspect(t, id).Config.Labels[jail.LabelRole], "no cold container either")
	}
	require.Zero(t, warmCount(t, b, "jetcrew_warm_claimed_total"), "no warm start")
	require.Zero(t, warmCount(t, b, "jetcrew_warm_missed_total"), "nor a cold one")
	wr.allowWarm(1)
	warmReady(t, b, 1)
	require.NotEqual(t, claimed, wr.warmIDs()[len(wr.warmIDs())-1], "the pool made another")
}

// TestWarmKilledWorkerLeavesNoOrphan: the real `jetcrew worker`, killed
// with SIGKILL while its pool of two is full, leaves its two warm
// containers behind (their launchers exit with the worker's end of the
// hand-off socket, the containers stay); restarted with the same id and
// state directory, it removes them before it makes its new pool, so only
// the new pool's containers remain (none of the old names or ids);
// stopped, it leaves none.
func TestWarmKilledWorkerLeavesNoOrphan(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	_, cli := jailDocker(t)
	s := workertest.StartServer(t)
	url := s.ClientURL()
	tmp, err := os.MkdirTemp("", "jcw")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	profiles := filepath.Join(tmp, "p.toml")
	require.NoError(t, os.WriteFile(profiles, []byte(jailProfile("hot", "warm = 2")), 0o644))
	state := filepath.Join(tmp, "s")
	id := "warmkill-" + opsSuffix(t)
	args := []string{"--profiles", profiles, "--state-dir", state, "--metrics-addr", "127.0.0.1:0"}
	t.Cleanup(func() {
		// Should the test fail between the kill and the restart.
		out, _ := exec.Command("docker", "ps", "-aq", "--filter", "label="+jail.LabelWorker+"="+id).Output()
		for _, cid := range strings.Fields(string(out)) {
			removeRaw(t, cli, cid)
		}
	})

	warmContainers := func() map[string]string { // id → name
		out, err := exec.Command("docker", "ps", "-a", "--no-trunc", "--filter", "label="+jail.LabelWorker+"="+id,
			"--format", "{{.ID}} {{.Names}} {{.Label \""+jail.LabelRole+"\"}}").Output()
		require.NoError(t, err)
		cs := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if f := strings.Fields(l); len(f) == 3 {
				require.Equal(t, jail.RoleWarm, f[2], "only warm containers: %s", l)
				cs[f[0]] = f[1]
			}
		}
		return cs
	}

	first := startOpsWorker(t, url, id, nil, args...)
	opsWarmReady(t, first, 2)
	old := warmContainers()
	require.Len(t, old, 2, "a full pool")

	require.NoError(t, first.cmd.Process.Signal(syscall.SIGKILL))
	ps := first.wait(t, 30*time.Second)
	ws, ok := ps.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "%v", ps)
	// Their launchers exit once the worker's end of their hand-off
	// sockets closes, but the containers stay until someone removes them.
	require.Equal(t, old, warmContainers(), "the killed worker left its warm containers behind")
	for cid := range old {
		info, err := cli.ContainerInspect(context.Background(), cid)
		require.NoError(t, err)
		t.Logf("left by the killed worker: %s, %s", info.Name, info.State.Status)
	}

	second := startOpsWorker(t, url, id, nil, args...)
	opsWarmReady(t, second, 2)
	now := warmContainers()
	require.Len(t, now, 2, "only the new pool: %v", now)
	for cid, name := range old {
		require.NotContains(t, now, cid)
		require.NotContains(t, slices.Collect(maps.Values(now)), name, "an old warm container's name")
		require.True(t, containerGone(t, cli, cid), "%s removed", name)
	}
	require.Equal(t, 2, strings.Count(second.stderr.String(), "removing a warm container no pool or run holds"), second.stderr.String())

	second.stop(t)
	require.Empty(t, warmContainers(), "a stopped worker leaves no warm container")
}

// metricsAddrRE finds the address a `jetcrew worker --metrics-addr
// 127.0.0.1:0` serves /metrics on, in its JSON log.
var metricsAddrRE = regexp.MustCompile(`"addr":"([^"]+)"[^\n]*serving /metrics`)

// opsWarmReady waits until the `jetcrew worker` process w reports n ready
// warm containers on its /metrics (jetcrew_warm_ready).
func opsWarmReady(t *testing.T, w *opsWorker, n int) {
	t.Helper()
	var addr string
	require.Eventually(t, func() bool {
		m := metricsAddrRE.FindStringSubmatch(w.stderr.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	}, 30*time.Second, 20*time.Millisecond, "worker %s never served /metrics\n%s", w.id, w.stderr.String())
	want := regexp.MustCompile(`(?m)^jetcrew_warm_ready\{[^}]*\} ` + strconv.Itoa(n) + `$`)
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return false
		}
		return want.Match(body)
	}, time.Minute, 50*time.Millisecond, "worker %s never had %d warm containers ready\n%s", w.id, n, w.stderr.String())
}

// TestWarmProfileReloadSIGHUP: the real `jetcrew worker`, sent SIGHUP
// after its profile file changed, replaces the warm container of the
// changed profile with one of the new definition (here its pids limit);
// sent SIGHUP after the file became invalid, it logs the refusal and
// keeps its profiles and its pool as they were.
func TestWarmProfileReloadSIGHUP(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	_, cli := jailDocker(t)
	s := workertest.StartServer(t)
	tmp, err := os.MkdirTemp("", "jcr")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	profiles := filepath.Join(tmp, "p.toml")
	write := func(extra string) {
		require.NoError(t, os.WriteFile(profiles, []byte(jailProfile("hot", "warm = 1\n"+extra)), 0o644))
	}
	write("pids = 77")
	id := "warmhup-" + opsSuffix(t)
	w := startOpsWorker(t, s.ClientURL(), id, nil, "--profiles", profiles, "--state-dir", filepath.Join(tmp, "s"), "--metrics-addr", "127.0.0.1:0")
	pool := func() map[string]int64 { // container id → pids limit
		out, err := exec.Command("docker", "ps", "-q", "--no-trunc", "--filter", "label="+jail.LabelWorker+"="+id,
			"--filter", "label="+jail.LabelRole+"="+jail.RoleWarm).Output()
		require.NoError(t, err)
		m := map[string]int64{}
		for _, cid := range strings.Fields(string(out)) {
			info, err := cli.ContainerInspect(context.Background(), cid)
			if err == nil && info.HostConfig.PidsLimit != nil {
				m[cid] = *info.HostConfig.PidsLimit
			}
		}
		return m
	}
	opsWarmReady(t, w, 1)
	before := pool()
	require.Len(t, before, 1)
	for _, pids := range before {
		require.EqualValues(t, 77, pids)
	}

	// Invalid: refused, nothing changes.
	write("pids = 77\nbogus_key = 1")
	require.NoError(t, w.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(w.stderr.String(), "profile reload refused") },
		30*time.Second, 20*time.Millisecond, "%s", w.stderr.String())
	require.Contains(t, w.stderr.String(), "bogus_key")
	time.Sleep(time.Second)
	require.Equal(t, before, pool(), "the pool is kept")

	// Valid: the changed profile's pool is replaced.
	write("pids = 99")
	require.NoError(t, w.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(w.stderr.String(), "profiles reloaded") },
		30*time.Second, 20*time.Millisecond, "%s", w.stderr.String())
	var now map[string]int64
	require.Eventually(t, func() bool {
		now = pool()
		if len(now) != 1 {
			return false
		}
		for cid, pids := range now {
			if _, old := before[cid]; old || pids != 99 {
				return false
			}
		}
		return true
	}, time.Minute, 100*time.Millisecond, "the pool holds %v\n%s", now, w.stderr.String())
	opsWarmReady(t, w, 1)
	for cid := range before {
		require.Eventually(t, func() bool { return containerGone(t, cli, cid) }, 30*time.Second, 50*time.Millisecond)
	}
	w.stop(t)
}

// TestWarmImageRebuiltReplacesPool: the real `jetcrew worker` replaces a
// warm container whose profile's image reference now names another image
// (rebuilt: here re-tagged), within the pool's check interval (10 s), with
// one of the new image; the Docker runtime answers the pool's image id
// check (warm.ImageLister).
func TestWarmImageRebuiltReplacesPool(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	_, cli := jailDocker(t)
	s := workertest.StartServer(t)
	tmp, err := os.MkdirTemp("", "jci")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	suffix := opsSuffix(t)
	ref := "jetcrew-warmimg-" + suffix + ":latest"
	tag := func(src string) string {
		out, err := exec.Command("docker", "tag", src, ref).CombinedOutput()
		require.NoError(t, err, "%s", out)
		info, err := cli.ImageInspect(context.Background(), ref)
		require.NoError(t, err)
		return info.ID
	}
	oldID := tag(jailImage)
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", ref).Run() })
	profiles := filepath.Join(tmp, "p.toml")
	require.NoError(t, os.WriteFile(profiles, []byte(strings.Replace(jailProfile("hot", "warm = 1"), jailImage, ref, 1)), 0o644))
	id := "warmimg-" + suffix
	w := startOpsWorker(t, s.ClientURL(), id, nil, "--profiles", profiles, "--state-dir", filepath.Join(tmp, "s"), "--metrics-addr", "127.0.0.1:0")
	pool := func() map[string]string { // container id → image id
		out, err := exec.Command("docker", "ps", "-q", "--no-trunc", "--filter", "label="+jail.LabelWorker+"="+id,
			"--filter", "label="+jail.LabelRole+"="+jail.RoleWarm).Output()
		require.NoError(t, err)
		m := map[string]string{}
		for _, cid := range strings.Fields(string(out)) {
			if info, err := cli.ContainerInspect(context.Background(), cid); err == nil {
				m[cid] = info.Image
			}
		}
		return m
	}
	opsWarmReady(t, w, 1)
	before := pool()
	require.Len(t, before, 1)
	for _, img := range before {
		require.Equal(t, oldID, img)
	}

	newID := tag("jetcrew-sandbox:latest") // the image "rebuilt": another one under its reference
	require.NotEqual(t, oldID, newID)
	var now map[string]string
	require.Eventually(t, func() bool {
		now = pool()
		for _, img := range now {
			if img == newID && len(now) == 1 {
				return true
			}
		}
		return false
	}, time.Minute, 200*time.Millisecond, "the pool holds %v\n%s", now, w.stderr.String())
	for cid := range before {
		require.Eventually(t, func() bool { return containerGone(t, cli, cid) }, 30*time.Second, 50*time.Millisecond)
	}
	require.Contains(t, w.stderr.String(), `"reason":"image"`)
	w.stop(t)
}

// TestWarmImageRetaggedBeforeBurst: the profile's image reference
// re-tagged to another image just before a burst of 20 submits (the
// pool's periodic check, every 10 s, has not run): no run starts in a
// container of the old image (agent-sandbox#764). The first claims find
// the image changed (one image inspect per claim) and start cold; the
// pool's other containers of the old image are removed at once
// (jetcrew_warm_replaced_total, reason image) and the pool refills with
// the new image. Each run's container, as the engine shows it, and each
// receipt's image id are the new image's.
func TestWarmImageRetaggedBeforeBurst(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	ref := "jetcrew-warmburst-" + randomHex(t) + ":latest"
	tag := func(t *testing.T, cli *client.Client, src string) string {
		out, err := exec.Command("docker", "tag", src, ref).CombinedOutput()
		require.NoError(t, err, "%s", out)
		info, err := cli.ImageInspect(context.Background(), ref)
		require.NoError(t, err)
		return info.ID
	}
	_, cli := jailDocker(t)
	oldID := tag(t, cli, jailImage)
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", ref).Run() })
	b, wr := startWarm(t, strings.Replace(jailProfile("hot", "warm = 4"), jailImage, ref, 1), -1, nil)
	warmReady(t, b, 4)
	for _, id := range wr.warmIDs() {
		require.Equal(t, oldID, wr.inspect(t, id).Image)
	}

	newID := tag(t, cli, "jetcrew-sandbox:latest") // rebuilt: another image under the reference
	require.NotEqual(t, oldID, newID)
	const runs = 20
	for i := range runs {
		b.submit(t, fmt.Sprintf("burst-%d", i), "hot", `echo ok`, 2*time.Minute)
	}
	warmRuns := 0
	for i := range runs {
		id := fmt.Sprintf("burst-%d", i)
		st := b.waitFinal(t, id)
		require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
		require.Equal(t, "ok\n", string(b.output(t, id).stdout))
		require.Equal(t, newID, wr.inspect(t, st.ContainerID).Image, "run %s (warm %t) started in a container of the old image", id, st.Warm)
		require.Equal(t, newID, st.Receipt.ImageID, id)
		if st.Warm {
			warmRuns++
		}
	}
	t.Logf("%d of %d runs started warm, in containers of the new image", warmRuns, runs)
	require.GreaterOrEqual(t, warmCount(t, b, "jetcrew_warm_replaced_total"), 4.0, "the four containers of the old image are replaced")
	warmReady(t, b, 4)
	for _, id := range wr.warmIDs()[len(wr.warmIDs())-4:] {
		require.Equal(t, newID, wr.inspect(t, id).Image, "the pool refilled with the new image")
	}
}

// launcherPID returns the host pid of the launcher (`launch --handoff`)
// waiting in warm container id (`docker top`), the child of the
// container's init.
func launcherPID(t *testing.T, cli *client.Client, id string) int {
	t.Helper()
	top, err := cli.ContainerTop(context.Background(), id, nil)
	require.NoError(t, err)
	pidCol := slices.Index(top.Titles, "PID")
	cmdCol := slices.Index(top.Titles, "CMD")
	require.True(t, pidCol >= 0 && cmdCol >= 0, "docker top titles: %v", top.Titles)
	for _, p := range top.Processes {
		// Not the container's init, whose command line holds the
		// launcher's.
		if strings.HasPrefix(p[cmdCol], messages.ContainerBridgePath+" launch --handoff") {
			pid, err := strconv.Atoi(p[pidCol])
			require.NoError(t, err)
			return pid
		}
	}
	t.Fatalf("no launcher in warm container %s: %v", id, top.Processes)
	return 0
}

// TestWarmUnresponsiveFallsBackCold: a warm container that is paused
// (`docker pause`), or whose launcher is stopped (SIGSTOP to its process,
// not to the container's init), answers no probe before its hand-off: it
// is never handed the run, which starts cold, its container created
// within 2 s of the submit, and succeeds; the unresponsive container is
// counted replaced (reason unresponsive) and removed, and the pool makes
// another.
func TestWarmUnresponsiveFallsBackCold(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	for name, freeze := range map[string]func(t *testing.T, cli *client.Client, id string){
		"paused": func(t *testing.T, cli *client.Client, id string) {
			require.NoError(t, cli.ContainerPause(context.Background(), id))
		},
		"stopped": func(t *testing.T, cli *client.Client, id string) {
			require.NoError(t, syscall.Kill(launcherPID(t, cli, id), syscall.SIGSTOP))
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b, wr := startWarm(t, jailProfile("hot", "warm = 1"), -1, nil)
			warmReady(t, b, 1)
			frozen := wr.warmIDs()[0]
			freeze(t, b.cli, frozen)

			submitted := time.Now()
			st, out := b.runScript(t, "frozen-"+name, "hot", `echo ok`)
			require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
			require.Equal(t, "ok\n", string(out.stdout))
			require.False(t, st.Warm, "started cold")
			require.NotEqual(t, frozen, st.ContainerID, "the %s container was never handed the run", name)
			info := wr.inspect(t, st.ContainerID)
			require.Equal(t, jail.RoleRun, info.Config.Labels[jail.LabelRole])
			created, err := time.Parse(time.RFC3339Nano, info.Created)
			require.NoError(t, err)
			t.Logf("submit to the cold container's creation: %s", created.Sub(submitted))
			require.Less(t, created.Sub(submitted), 2*time.Second, "the run fell back to cold within 2 s")
			require.EqualValues(t, 1, warmCount(t, b, "jetcrew_warm_replaced_total"))
			require.Zero(t, warmCount(t, b, "jetcrew_warm_claimed_total"))
			require.Eventually(t, func() bool { return containerGone(t, b.cli, frozen) }, 30*time.Second, 50*time.Millisecond,
				"the %s container is removed", name)
			warmReady(t, b, 1)
		})
	}
}

// warmLateProfile is profile wglate of the late-binding test: one warm
// container, coordination on (a warm container waits in the bridge's
// launcher), and the lines extra (its egress keys).
func warmLateProfile(image, extra string) string {
	return fmt.Sprintf("[profiles.wglate]\nimage = %q\ncommand = [\"/bin/sh\", \"-c\", \"{prompt}\"]\nrequire_bridge = false\nwarm = 1\n%s\n", image, extra)
}

// TestWarmEgressReloadBindsLate: a profile file reloaded with another
// egress allowlist, an egress_inject and a model budget for a profile that
// keeps a warm container (keys a run reads from its own profile, bound
// late) keeps the container made before the reload, and the next run,
// warm in it, gets the new values, none of the old: its proxy refuses the
// host the old allowlist named, injects the key on the host the new one
// names, and answers the request past max_model_requests = 1 itself, the
// worker then ending the run failed for that budget.
func TestWarmEgressReloadBindsLate(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	var image string
	e := startEgressWorkerOpts(t, egressOptions{publicNet: true, profiles: func(img string) string {
		image = img
		return warmLateProfile(img, `egress = ["api.provider.test:443"]`)
	}})
	ready := func() bool {
		for _, st := range e.w.WarmStatus() {
			if st.Profile == "wglate" {
				return st.Ready == 1
			}
		}
		return false
	}
	require.Eventually(t, ready, time.Minute, 20*time.Millisecond, "%+v", e.w.WarmStatus())
	warmIDs := func() []string {
		out, err := exec.Command("docker", "ps", "-q", "--no-trunc", "--filter", "label="+jail.LabelProfile+"=wglate",
			"--filter", "label="+jail.LabelRole+"="+jail.RoleWarm).Output()
		require.NoError(t, err)
		return strings.Fields(string(out))
	}
	before := warmIDs()
	require.Len(t, before, 1)

	ps, err := profile.ParseProfiles("reload", []byte(warmLateProfile(image, `egress = ["inj.provider.test:443"]
egress_inject = [{ host = "inj.provider.test:443", header = "x-api-key", from_env = "JETCREW_TEST_PROVIDER_KEY" }]
max_model_requests = 1`)))
	require.NoError(t, err)
	changed, err := e.w.ReloadProfiles(context.Background(), ps)
	require.NoError(t, err)
	require.Contains(t, changed, "wglate")
	require.Equal(t, before, warmIDs(), "the pool is kept")

	id := "wglate-" + opsSuffix(t)
	e.submit(t, id, "wglate", fmt.Sprintf(`m='%s'
echo "api $(egress-fixture get https://api.provider.test/ 2>&1 | tr '\n' ' ')"
echo "R1 $(egress-fixture post https://inj.provider.test/v1/messages "$m")"
echo "R2 $(egress-fixture post https://inj.provider.test/v1/messages "$m")"
echo DONE
sleep 60
`, messagesBody(false)))
	st := waitState(t, e.url, id, func(s messages.RunState) bool { return s.State.Final() })
	out, _ := egressRunOutput(t, e.js, id)
	require.True(t, st.Warm, "%s\n%s", st.Reason, out)
	require.Equal(t, before[0], st.ContainerID, "the container made before the reload took the run")
	res := scriptLines(out)
	require.Contains(t, res["api"], "Forbidden", "the old allowlist's host is refused")
	require.True(t, strings.HasPrefix(res["R1"], "status=200 "+keyTag(providerKey)), "R1, the new injection: %s", res["R1"])
	require.True(t, strings.HasPrefix(res["R2"], "status=429 key=- body="), "R2, past the new budget: %s", res["R2"])
	require.Equal(t, messages.StateFailed, st.State, "%s\n%s", st.Reason, out)
	require.Contains(t, st.Reason, "budget reached: max_model_requests 1")
	require.NotContains(t, out, providerKey)
}
