package tests

// The jail, proven from inside real containers.
//
// Each test drives the real worker (worker.New with the Docker runtime of
// worker/docker) against a fresh embedded nats-server, submits run requests
// the way any client does, and asserts what the run recorded: its state in
// the jetcrew-runs bucket and its events on JETCREW_EVENTS. The facts about
// the jail are measured by the jailed, non-root process itself and come back
// as the run's output. docs/jail.md maps every promise to the Docker field
// that provides it and to the test here that proves it.
//
// The runs use jetcrew-testimg:latest (deploy/testimage: the sandbox's
// busybox plus a setuid-root probe), built on first use when missing or out
// of date. Network tests only ever send traffic to loopback or to a Docker
// network the test creates itself.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	dockernet "github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/docker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// jailImage is the image deploy/testimage/build.sh builds.
const jailImage = "jetcrew-testimg:latest"

// The shared Docker runtime and client of the jail tests, and the real
// jetcrew-bridge binary the workers mount into every run, set up once.
var (
	jailOnce   sync.Once
	jailRT     *docker.Runtime
	jailCli    *client.Client
	jailBridge string
	jailErr    error
)

// jailDocker returns the Docker runtime and a raw Docker client shared by
// the jail tests, building the test image first (deploy/testimage/build.sh
// is a no-op when the image is up to date), and finds the jetcrew-bridge
// binary next to the jetcrew binary TestMain built. It fails the test when Docker
// is unreachable; under JETCREW_SKIP_DOCKER=1 no test gets here (needsDocker).
func jailDocker(t *testing.T) (*docker.Runtime, *client.Client) {
	t.Helper()
	jailOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		build := exec.CommandContext(ctx, "bash", filepath.Join(repoRoot(), "deploy", "testimage", "build.sh"))
		build.Env = append(os.Environ(), "TEST_IMAGE="+jailImage)
		if out, err := build.CombinedOutput(); err != nil {
			jailErr = fmt.Errorf("build %s: %w\n%s", jailImage, err, out)
			return
		}
		// TestMain builds the bridge beside jetcrew; build it there if not.
		jailBridge = filepath.Join(filepath.Dir(jetcrewBin), "jetcrew-bridge")
		if _, err := os.Stat(jailBridge); err != nil {
			build = exec.CommandContext(ctx, "go", "build", "-o", jailBridge, "./cmd/jetcrew-bridge")
			build.Dir = repoRoot()
			build.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := build.CombinedOutput(); err != nil {
				jailErr = fmt.Errorf("build jetcrew-bridge: %w\n%s", err, out)
				return
			}
		}
		if jailRT, jailErr = docker.New(ctx, docker.Config{Logger: zerolog.Nop()}); jailErr != nil {
			return
		}
		jailCli, jailErr = client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	})
	require.NoError(t, jailErr, "the jail tests need a Docker engine (JETCREW_SKIP_DOCKER=1 skips them deliberately)")
	return jailRT, jailCli
}

// recordingRuntime is the Docker runtime with a record of what the worker
// asked of it: every spec, and the engine's view of every container
// (ContainerInspect right after Start, before the worker can remove it).
type recordingRuntime struct {
	jail.Runtime
	cli *client.Client

	mu       sync.Mutex
	specs    map[string]jail.ContainerSpec        // by run id
	inspects map[string]container.InspectResponse // by run id
}

func (r *recordingRuntime) Start(ctx context.Context, spec jail.ContainerSpec, out jail.OutputFunc) (jail.Container, error) {
	runID := spec.Labels[jail.LabelRunID]
	r.mu.Lock()
	r.specs[runID] = spec
	r.mu.Unlock()
	c, err := r.Runtime.Start(ctx, spec, out)
	if err != nil {
		return nil, err
	}
	if info, err := r.cli.ContainerInspect(ctx, c.ID()); err == nil {
		r.mu.Lock()
		r.inspects[runID] = info
		r.mu.Unlock()
	}
	return c, nil
}

func (r *recordingRuntime) spec(runID string) (jail.ContainerSpec, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.specs[runID]
	return s, ok
}

func (r *recordingRuntime) inspect(runID string) (container.InspectResponse, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.inspects[runID]
	return i, ok
}

// jailBundle is one test's worker on real Docker and a fresh nats-server.
type jailBundle struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	rt       *recordingRuntime
	docker   *docker.Runtime
	cli      *client.Client
	w        *worker.Worker
	workerID string
}

// startJail starts a worker with the profiles in profilesTOML (TOML, as in a
// profile file) on the shared Docker runtime. mod may change the config.
func startJail(t *testing.T, profilesTOML string, mod func(*worker.Config)) *jailBundle {
	t.Helper()
	rt, cli := jailDocker(t)
	s := workertest.StartServer(t)
	nc := workertest.Connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	profiles, err := profile.ParseProfiles(t.Name(), []byte(profilesTOML))
	require.NoError(t, err)
	rec := &recordingRuntime{Runtime: rt, cli: cli, specs: map[string]jail.ContainerSpec{}, inspects: map[string]container.InspectResponse{}}
	cfg := worker.Config{
		ID:             "jt-" + randomHex(t),
		Runtime:        rec,
		Profiles:       profiles,
		Concurrency:    4,
		FetchWait:      2 * time.Second,
		DefaultTimeout: 2 * time.Minute,
		BridgePath:     jailBridge,
		StateDir:       workertest.StateDir(t),
	}
	if mod != nil {
		mod(&cfg)
	}
	w, err := worker.New(nc, cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	return &jailBundle{nc: nc, js: js, rt: rec, docker: rt, cli: cli, w: w, workerID: cfg.ID}
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 5)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// jailProfile returns the TOML of a profile running {prompt} with /bin/sh
// in the test image (coordination on; /bin/sh is no MCP client, so its runs
// may end without reaching their bridge); extra holds more keys, one per
// line.
func jailProfile(name, extra string) string {
	return fmt.Sprintf("[profiles.%s]\nimage = %q\ncommand = [\"/bin/sh\", \"-c\", \"{prompt}\"]\nrequire_bridge = false\n%s\n", name, jailImage, extra)
}

// submit publishes a run request, as any NATS client would.
func (b *jailBundle) submit(t *testing.T, id, profile, prompt string, timeout time.Duration) {
	t.Helper()
	data, err := json.Marshal(messages.RunRequest{ID: id, Profile: profile, Prompt: prompt, Timeout: messages.Duration(timeout)})
	require.NoError(t, err)
	_, err = b.js.Publish(context.Background(), messages.SubjectRuns(messages.DefaultPool), data, jetstream.WithMsgID(id))
	require.NoError(t, err)
}

func (b *jailBundle) state(t *testing.T, id string) (messages.RunState, bool) {
	t.Helper()
	kv, err := b.js.KeyValue(context.Background(), messages.BucketRuns)
	require.NoError(t, err)
	e, err := kv.Get(context.Background(), id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return messages.RunState{}, false
	}
	require.NoError(t, err)
	var st messages.RunState
	require.NoError(t, json.Unmarshal(e.Value(), &st))
	return st, true
}

// waitState polls the run's state until ok accepts it.
func (b *jailBundle) waitState(t *testing.T, id string, within time.Duration, ok func(messages.RunState) bool) messages.RunState {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st, found := b.state(t, id)
		if found && ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s: still %+v after %s", id, st, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFinal waits for the run's final state.
func (b *jailBundle) waitFinal(t *testing.T, id string) messages.RunState {
	t.Helper()
	return b.waitState(t, id, 2*time.Minute, func(st messages.RunState) bool { return st.State.Final() })
}

// runScript submits prompt under profile and returns the run's final state
// and its output.
func (b *jailBundle) runScript(t *testing.T, id, profile, prompt string) (messages.RunState, runOutput) {
	t.Helper()
	b.submit(t, id, profile, prompt, time.Minute)
	st := b.waitFinal(t, id)
	return st, b.output(t, id)
}

// runOutput is a run's output as recorded in its events.
type runOutput struct {
	stdout, stderr []byte
	// chunks are the output events' bodies, with their stream, in stream
	// (JETCREW_EVENTS) order.
	chunks []outputChunk
}

type outputChunk struct {
	stream string
	data   []byte
}

// events returns every event of run id, in stream order.
func (b *jailBundle) events(t *testing.T, id string) []jetstream.Msg {
	t.Helper()
	return workertest.Events(t, b.js, id)
}

// output reads the run's output events (subject jetcrew.events.<id>.output,
// raw body, header Jetcrew-Stream). It checks what every output event
// promises: a known stream, a body of at most MaxOutputChunk bytes, and a
// Jetcrew-Offset equal to the bytes of that stream before it (so nothing is
// missing, duplicated or reordered within a stream), and a Jetcrew-Seq one
// more than the attempt's chunk before it, of either stream (the worker's
// read order is the stream's order).
func (b *jailBundle) output(t *testing.T, id string) runOutput {
	t.Helper()
	var o runOutput
	offsets := map[string]int{}
	seqs := map[string]int{}
	for _, m := range b.events(t, id) {
		if m.Subject() != messages.SubjectEvents(id, messages.EventOutput) {
			continue
		}
		stream := m.Headers().Get(messages.HeaderStream)
		require.Contains(t, []string{messages.StreamStdout, messages.StreamStderr}, stream)
		require.LessOrEqual(t, len(m.Data()), messages.MaxOutputChunk)
		require.Equal(t, strconv.Itoa(offsets[stream]), m.Headers().Get(messages.HeaderOffset), "offset of a %s chunk", stream)
		offsets[stream] += len(m.Data())
		attempt := m.Headers().Get(messages.HeaderAttempt)
		seqs[attempt]++
		require.Equal(t, strconv.Itoa(seqs[attempt]), m.Headers().Get(messages.HeaderSeq), "seq of chunk %d of attempt %s", seqs[attempt], attempt)
		o.chunks = append(o.chunks, outputChunk{stream, m.Data()})
		if stream == messages.StreamStdout {
			o.stdout = append(o.stdout, m.Data()...)
		} else {
			o.stderr = append(o.stderr, m.Data()...)
		}
	}
	return o
}

// values parses "key=value" words from the lines of out.
func values(out []byte) map[string]string {
	v := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		for _, w := range strings.Fields(sc.Text()) {
			if k, val, ok := strings.Cut(w, "="); ok {
				v[k] = val
			}
		}
	}
	return v
}

// TestJailIdentity: the process runs as the profile's non-root uid and gid,
// with no capabilities at all, no-new-privileges and seccomp; a setuid-root
// binary does not make it root, nor may it create a user namespace; the
// limits the profile sets are the ones the kernel enforces.
func TestJailIdentity(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	b := startJail(t, jailProfile("ident", `user = "4242:4343"
memory_mib = 96
cpus = 0.5
pids = 77`), nil)

	script := `
grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status | tr -d ' ' | tr '\t' '='
stat -c 'probe_mode=%a probe_owner=%u:%g' /bin/suidprobe
/bin/suidprobe
if unshare -U -r true 2>/dev/null; then echo userns=allowed; else echo userns=refused; fi
for f in pids.max pids/pids.max memory.max memory/memory.limit_in_bytes memory.swap.max memory/memory.memsw.limit_in_bytes cpu.max cpu/cpu.cfs_quota_us cpu/cpu.cfs_period_us; do
  [ -r /sys/fs/cgroup/$f ] && echo "cg:$f=$(cat /sys/fs/cgroup/$f | tr ' ' _)"
done
exit 0`
	st, out := b.runScript(t, "ident", "ident", script)
	require.Equal(t, messages.StateSucceeded, st.State, "reason %q, stderr %s", st.Reason, out.stderr)
	v := values(out.stdout)

	require.Equal(t, "4242=4242=4242=4242", v["Uid:"], "real, effective, saved and fs uid")
	require.Equal(t, "4343=4343=4343=4343", v["Gid:"], "real, effective, saved and fs gid")
	require.NotContains(t, strings.Split(v["Groups:"], "="), "0", "no supplementary root group")
	for _, c := range []string{"CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"} {
		require.Equal(t, "0000000000000000", v[c], "%s: no capabilities, not even in the bounding set", c)
	}
	require.Equal(t, "1", v["NoNewPrivs:"])
	require.Equal(t, "2", v["Seccomp:"], "a seccomp filter (Docker's default profile) is in force")

	// The probe really is setuid root in the image (see the control
	// below), yet it runs with the caller's ids and cannot become root.
	require.Equal(t, "4755", v["probe_mode"])
	require.Equal(t, "0:0", v["probe_owner"])
	require.Equal(t, "4242", v["ruid"])
	require.Equal(t, "4242", v["euid"], "a setuid-root binary must not raise privileges")
	require.Equal(t, "4343", v["egid"])
	require.Equal(t, "operation not permitted", strings.TrimPrefix(regexp.MustCompile(`setuid0=.*`).FindString(string(out.stdout)), "setuid0="))
	require.Equal(t, "refused", v["userns"])

	// The limits, as the kernel's cgroup files say (v1 or v2).
	cg := func(names ...string) string {
		for _, n := range names {
			if x, ok := v["cg:"+n]; ok {
				return x
			}
		}
		t.Fatalf("none of %v in the output:\n%s", names, out.stdout)
		return ""
	}
	require.Equal(t, "77", cg("pids.max", "pids/pids.max"))
	require.Equal(t, strconv.Itoa(96<<20), cg("memory.max", "memory/memory.limit_in_bytes"))
	if x, ok := v["cg:memory.swap.max"]; ok {
		require.Equal(t, "0", x, "no swap")
	} else {
		require.Equal(t, strconv.Itoa(96<<20), cg("memory/memory.memsw.limit_in_bytes"), "memory+swap = memory: no swap")
	}
	if x, ok := v["cg:cpu.max"]; ok {
		require.Equal(t, "50000_100000", x)
	} else {
		quota, _ := strconv.Atoi(cg("cpu/cpu.cfs_quota_us"))
		period, _ := strconv.Atoi(cg("cpu/cpu.cfs_period_us"))
		require.Equal(t, 0.5, float64(quota)/float64(period), "half a CPU")
	}

	t.Run("control: the probe is effective without no-new-privileges", func(t *testing.T) {
		// Same image and user, every capability dropped, but without
		// no-new-privileges: the kernel honours the setuid bit. This shows
		// that the jail's euid above is no-new-privileges' doing, not a
		// broken probe or a nosuid mount.
		out := runRaw(t, b.cli, &container.Config{Image: jailImage, User: "4242:4343", Cmd: []string{"/bin/suidprobe"}},
			&container.HostConfig{NetworkMode: "none", CapDrop: []string{"ALL"}, ReadonlyRootfs: true})
		require.Contains(t, out, "ruid=4242 euid=0 ")
	})
}

// runRaw runs a container straight on the engine (not through jetcrew),
// waits for it and returns its output. It is removed when the test ends.
func runRaw(t *testing.T, cli *client.Client, cfg *container.Config, host *container.HostConfig) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := "jetcrew-test-raw-" + randomHex(t)
	created, err := cli.ContainerCreate(ctx, cfg, host, nil, nil, name)
	require.NoError(t, err)
	t.Cleanup(func() { removeRaw(t, cli, created.ID) })
	waitC, errC := cli.ContainerWait(ctx, created.ID, container.WaitConditionNextExit)
	require.NoError(t, cli.ContainerStart(ctx, created.ID, container.StartOptions{}))
	select {
	case <-waitC:
	case err := <-errC:
		require.NoError(t, err)
	}
	out, err := exec.CommandContext(ctx, "docker", "logs", created.ID).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}

func removeRaw(t *testing.T, cli *client.Client, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := cli.ContainerRemove(ctx, id, container.RemoveOptions{Force: true, RemoveVolumes: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		t.Errorf("remove container %s: %v", id, err)
	}
}

// TestJailFilesystem: the root file system is read-only, /tmp and HOME are
// writable (HOME owned by the run's user), nothing else is writable but
// /dev/shm and /dev/mqueue (Docker's, memory-backed) and the bind mounts
// the worker added read-write; every bind mount the worker adds is a typed
// bind, read-only in /proc/self/mountinfo when the spec says so; no Docker
// or containerd socket is reachable.
func TestJailFilesystem(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	b := startJail(t, jailProfile("fs", ""), nil)

	script := `
if touch /probe 2>/tmp/err; then echo root=writable; else echo "root=$(cat /tmp/err)"; fi
if mkdir /etc/probe 2>/tmp/err; then echo etc=writable; else echo "etc=$(cat /tmp/err)"; fi
for f in /etc/hosts /etc/hostname /etc/resolv.conf; do
  if (: >>"$f") 2>/dev/null; then echo "etc_file=$f:writable"; fi
done
echo x >/tmp/probe && echo tmp=writable
echo x >"$HOME/probe" && echo home=writable
echo "home_owner=$(stat -c '%u:%g %a' "$HOME" | tr ' ' /)"
echo "cwd=$(pwd)"
for m in $(cut -d' ' -f5 /proc/self/mountinfo); do
  [ -d "$m" ] && touch "$m/.jetcrew-probe" 2>/dev/null && echo "writable_mount=$m"
done
for p in /var/run/docker.sock /run/docker.sock /run/containerd/containerd.sock /var/run/containerd/containerd.sock; do
  if [ -e "$p" ]; then echo "present=$p"; fi
done
find / \( -path /proc -o -path /sys \) -prune -o -type s -print 2>/dev/null | sed 's/^/socket=/'
echo ---mountinfo
cat /proc/self/mountinfo`
	st, out := b.runScript(t, "fs", "fs", script)
	require.Equal(t, messages.StateSucceeded, st.State, "reason %q, stderr %s", st.Reason, out.stderr)
	stdout := string(out.stdout)
	report, mountinfo, ok := strings.Cut(stdout, "---mountinfo\n")
	require.True(t, ok, stdout)
	v := values([]byte(report))

	require.Contains(t, report, "root=touch: /probe: Read-only file system\n")
	require.Contains(t, report, "etc=mkdir: can't create directory '/etc/probe': Read-only file system\n")
	require.Equal(t, "writable", v["tmp"])
	require.Equal(t, "writable", v["home"])
	require.Equal(t, "65532:65532/700", v["home_owner"])
	require.Equal(t, "/home/agent", v["cwd"])
	require.Equal(t, []string{"ro"}, mountOptions(t, mountinfo, "/", "ro", "rw"), "root file system mounted read-only")
	require.NotContains(t, report, "etc_file=")
	for _, f := range []string{"/etc/hosts", "/etc/hostname", "/etc/resolv.conf"} {
		require.Equal(t, []string{"ro"}, mountOptions(t, mountinfo, f, "ro", "rw"), "Docker's %s follows the read-only root", f)
	}

	spec, ok := b.rt.spec("fs")
	require.True(t, ok)
	info, ok := b.rt.inspect("fs")
	require.True(t, ok)

	// Every bind mount the worker adds is a typed bind mount (never a
	// legacy "Binds" entry, which would create a missing source as an
	// empty directory), read-only when the spec says so, and shows so
	// inside.
	require.Empty(t, info.HostConfig.Binds, "no legacy binds")
	require.Len(t, info.HostConfig.Mounts, len(spec.Mounts))
	wantWritable := []string{"/dev/mqueue", "/dev/shm", "/home/agent", "/tmp"}
	for i, m := range spec.Mounts {
		hm := info.HostConfig.Mounts[i]
		require.Equal(t, "bind", string(hm.Type), "mount %s", m.Target)
		require.Equal(t, m.Source, hm.Source)
		require.Equal(t, m.Target, hm.Target)
		require.Equal(t, m.ReadOnly, hm.ReadOnly, "mount %s", m.Target)
		if m.ReadOnly {
			require.Equal(t, []string{"ro"}, mountOptions(t, mountinfo, m.Target, "ro", "rw"), "mount %s", m.Target)
		} else {
			require.Equal(t, []string{"rw"}, mountOptions(t, mountinfo, m.Target, "ro", "rw"), "mount %s", m.Target)
			wantWritable = append(wantWritable, m.Target)
		}
	}
	t.Logf("the worker added %d bind mount(s): %+v", len(spec.Mounts), spec.Mounts)

	// Nothing else is writable: the jailed user tried every mount point.
	var writable []string
	for _, l := range strings.Split(report, "\n") {
		if m, ok := strings.CutPrefix(l, "writable_mount="); ok {
			writable = append(writable, m)
		}
	}
	sort.Strings(writable)
	sort.Strings(wantWritable)
	require.Equal(t, wantWritable, writable)

	// No engine socket: none of the well-known paths exist, and every
	// unix socket in the file system lies in a mount the worker added (the
	// bridge's run directory).
	require.NotContains(t, report, "present=")
	var sockets []string
	for _, l := range strings.Split(report, "\n") {
		if s, ok := strings.CutPrefix(l, "socket="); ok {
			sockets = append(sockets, s)
			require.True(t, slices.ContainsFunc(spec.Mounts, func(m jail.Mount) bool {
				return strings.HasPrefix(s, strings.TrimSuffix(m.Target, "/")+"/")
			}), "unix socket %s outside the worker's mounts", s)
		}
	}
	t.Logf("unix sockets in the container: %v", sockets)
}

// TestJailMissingBindSource: a bind mount whose source is missing (here the
// bridge binary the worker mounts) fails the run, permanently and before any
// container exists; nothing is created at the missing path.
func TestJailMissingBindSource(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	missing := filepath.Join(t.TempDir(), "no-such-bridge")
	b := startJail(t, jailProfile("nobridge", ""), func(c *worker.Config) { c.BridgePath = missing })

	st, _ := b.runScript(t, "nobridge", "nobridge", "true")
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, 1, st.Attempts, "not retried")
	require.Nil(t, st.ExitCode, "nothing ran")
	require.Contains(t, st.Reason, "stat "+missing+": no such file or directory")
	_, started := b.rt.inspect("nobridge")
	require.False(t, started, "no container was created")
	_, err := os.Stat(missing)
	require.ErrorIs(t, err, os.ErrNotExist, "the missing source was not created")
}

// mountOptions returns which of flags appear in the per-mount options of the
// mount at target in a /proc/self/mountinfo dump (the last mount there wins,
// as it hides the others).
func mountOptions(t *testing.T, mountinfo, target string, flags ...string) []string {
	t.Helper()
	var got []string
	found := false
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[4] != target {
			continue
		}
		found = true
		got = nil
		for _, opt := range strings.Split(f[5], ",") {
			if slices.Contains(flags, opt) {
				got = append(got, opt)
			}
		}
	}
	require.True(t, found, "no mount at %s in mountinfo:\n%s", target, mountinfo)
	return got
}

// TestJailTmpfsFull: /tmp holds no more than the profile's tmp_mib (and
// HOME no more than home_mib); writing past it fails with ENOSPC, and the
// run's failure reason says a tmpfs is full.
func TestJailTmpfsFull(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	b := startJail(t, jailProfile("small", "tmp_mib = 1\nhome_mib = 2"), nil)

	script := `
cat /dev/zero >"$HOME/fill" 2>/dev/null; echo "home_rc=$? home_size=$(wc -c <"$HOME/fill")"
cat /dev/zero >/tmp/fill; rc=$?
echo "tmp_rc=$rc tmp_size=$(wc -c </tmp/fill)"
exit $rc`
	st, out := b.runScript(t, "tmpfull", "small", script)
	v := values(out.stdout)
	require.Equal(t, "1", v["home_rc"])
	require.Equal(t, strconv.Itoa(2<<20), v["home_size"], "HOME stops at home_mib")
	require.Equal(t, "1", v["tmp_rc"])
	require.Equal(t, strconv.Itoa(1<<20), v["tmp_size"], "/tmp stops at tmp_mib")
	require.Equal(t, "cat: write error: No space left on device\n", string(out.stderr))

	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, 1, *st.ExitCode)
	require.Equal(t, "exit code 1 (no space left on device: a tmpfs is full; /tmp is size=1m,mode=1777): "+
		"cat: write error: No space left on device", st.Reason)
}

// TestJailPidsLimit: a process bomb fills the profile's pids limit and is
// contained: it cannot fork past it, the run ends failed with a reason that
// names the limit, and meanwhile another run on the same worker and the host
// itself keep forking normally.
func TestJailPidsLimit(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	b := startJail(t, jailProfile("bomb", "pids = 32")+jailProfile("busy", ""), func(c *worker.Config) { c.Concurrency = 2 })

	// The neighbour forks a process every 50ms for more than 10 seconds,
	// long enough to outlast the bomb.
	b.submit(t, "neighbour", "busy", `i=0; while [ $i -lt 200 ]; do /bin/true || exit 9; usleep 50000; i=$((i+1)); done; echo forks=$i`, time.Minute)
	b.waitState(t, "neighbour", 30*time.Second, func(st messages.RunState) bool { return st.State == messages.StateRunning })

	// The bomb: a subshell starts sleepers until fork fails ("can't fork",
	// which ends that subshell); the shell then holds the limit for 2s
	// using builtins only, and exits. Its last stderr line is the shell's
	// fork failure.
	bomb := `
mkfifo /tmp/hold
( n=0; while sleep 60 & do n=$((n+1)); echo $n >/tmp/n; done )
read -r n </tmp/n; echo "sleepers=$n"
read -t 2 x <>/tmp/hold
echo held
exit 2`
	b.submit(t, "bomb", "bomb", bomb, time.Minute)
	// The host keeps forking while the bomb runs.
	st := b.waitState(t, "bomb", 2*time.Minute, func(st messages.RunState) bool {
		require.NoError(t, exec.Command("true").Run(), "the host can fork")
		return st.State.Final()
	})
	out := b.output(t, "bomb")
	t.Logf("bomb: %s stderr %q", out.stdout, out.stderr)

	v := values(out.stdout)
	n, err := strconv.Atoi(v["sleepers"])
	require.NoError(t, err, "%s", out.stdout)
	require.Greater(t, n, 20, "the bomb filled most of the limit")
	require.Less(t, n, 32, "and could not go past it")
	require.Equal(t, "held", strings.TrimSpace(strings.Split(string(out.stdout), "\n")[1]))
	require.Equal(t, "/bin/sh: can't fork: Resource temporarily unavailable\n", string(out.stderr))
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, 2, *st.ExitCode)
	require.Equal(t, "exit code 2 (pids limit of 32 reached: process creation failed): /bin/sh: can't fork: Resource temporarily unavailable", st.Reason)

	// The neighbour was running through the whole bomb and did not notice.
	nb, _ := b.state(t, "neighbour")
	require.Equal(t, messages.StateRunning, nb.State, "the neighbour outlives the bomb")
	nb = b.waitFinal(t, "neighbour")
	require.Equal(t, messages.StateSucceeded, nb.State, "reason %q", nb.Reason)
	require.True(t, nb.StartedAt.Before(st.StartedAt))
	require.Equal(t, "forks=200\n", string(b.output(t, "neighbour").stdout))
}

// TestJailMemoryOOM: allocating past the memory limit gets the process
// OOM-killed; the run ends failed with reason "oom", as the engine recorded
// it before the container was removed.
func TestJailMemoryOOM(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	b := startJail(t, jailProfile("tight", "memory_mib = 32"), nil)

	st, out := b.runScript(t, "oom", "tight", `echo start; x=aaaaaaaaaaaaaaaa; while :; do x=$x$x; done`)
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, "oom", st.Reason)
	require.Equal(t, 137, *st.ExitCode)
	require.Equal(t, "start\n", string(out.stdout))

	fin := finishedEvent(t, b, "oom")
	require.Equal(t, messages.StateFailed, fin.State)
	require.Equal(t, "oom", fin.Reason)
}

// finishedEvent returns the run's finished event. It follows the final
// state by the time the run's container is removed, so it is polled for.
func finishedEvent(t *testing.T, b *jailBundle, id string) messages.Event {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range b.events(t, id) {
			if m.Subject() == messages.SubjectEvents(id, messages.EventFinished) {
				var ev messages.Event
				require.NoError(t, json.Unmarshal(m.Data(), &ev))
				return ev
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("run %s has no finished event", id)
	return messages.Event{}
}

// TestJailNetwork: with network "none" (the default) a run has only lo, no
// route at all, and no TCP connection succeeds — not to a peer on a network
// the test created, nor to the host on that network, nor to the host's
// loopback; the same probe does reach the peer from a profile on that
// (internal) network, and a bridge profile gets an interface and a default
// route. Traffic only ever goes to loopback or to the test's own network.
func TestJailNetwork(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	_, cli := jailDocker(t)
	ctx := context.Background()

	netName := "jetcrew-test-" + randomHex(t)
	created, err := cli.NetworkCreate(ctx, netName, dockernet.CreateOptions{Driver: "bridge", Internal: true,
		Labels: map[string]string{"io.jetcrew.test": "jail"}})
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := cli.NetworkRemove(context.Background(), created.ID); err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("remove network %s: %v", netName, err)
		}
	})
	netInfo, err := cli.NetworkInspect(ctx, created.ID, dockernet.InspectOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, netInfo.IPAM.Config)
	gateway := netInfo.IPAM.Config[0].Gateway

	// A peer on the test's network answers "pong" on port 8080.
	peer := startPeer(t, cli, netName)

	// The host listens on its loopback and on its address in the test's
	// network; it must never see a connection.
	var hostConns []string
	var hostMu sync.Mutex
	listen := func(addr string) int {
		l, err := net.Listen("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		go func() { // ends when the listener is closed
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				hostMu.Lock()
				hostConns = append(hostConns, c.RemoteAddr().String())
				hostMu.Unlock()
				_, _ = c.Write([]byte("pong\n"))
				_ = c.Close()
			}
		}()
		return l.Addr().(*net.TCPAddr).Port
	}
	loPort := listen("127.0.0.1:0")
	gwPort := -1
	if gateway != "" {
		if l, err := net.Listen("tcp", gateway+":0"); err == nil {
			_ = l.Close()
			gwPort = listen(gateway + ":0")
		}
	}

	b := startJail(t, jailProfile("nonet", "")+
		jailProfile("internal", fmt.Sprintf("network = %q", netName))+
		jailProfile("bridged", `network = "bridge"`), nil)

	probe := func(targets ...string) string {
		var sb strings.Builder
		sb.WriteString("echo \"ifaces=$(ls /sys/class/net | tr '\\n' ,)\"\n")
		sb.WriteString("echo \"routes=$(tail -n +2 /proc/net/route | awk '{print $1\":\"$2}' | tr '\\n' ,)\"\n")
		for _, tgt := range targets {
			host, port, _ := strings.Cut(tgt, ":")
			// Three tries: the peer may still be starting.
			fmt.Fprintf(&sb, "r=failed; for i in 1 2 3; do if echo | nc -w 2 %s %s 2>/dev/null | grep -q pong; then r=connected; break; fi; usleep 200000; done; echo \"tcp_%s=$r\"\n",
				host, port, strings.NewReplacer(".", "_", ":", "_").Replace(tgt))
		}
		return sb.String()
	}
	key := func(tgt string) string { return "tcp_" + strings.NewReplacer(".", "_", ":", "_").Replace(tgt) }

	peerTgt := peer + ":8080"
	loTgt := fmt.Sprintf("127.0.0.1:%d", loPort)
	targets := []string{peerTgt, loTgt}
	if gwPort > 0 {
		targets = append(targets, fmt.Sprintf("%s:%d", gateway, gwPort))
	}

	t.Run("none", func(t *testing.T) {
		st, out := b.runScript(t, "net-none", "nonet", probe(targets...))
		require.Equal(t, messages.StateSucceeded, st.State, "reason %q", st.Reason)
		v := values(out.stdout)
		require.Equal(t, "lo,", v["ifaces"], "only loopback")
		require.Equal(t, "", v["routes"], "no route at all, so no default route")
		for _, tgt := range targets {
			require.Equal(t, "failed", v[key(tgt)], "TCP to %s", tgt)
		}
		info, _ := b.rt.inspect("net-none")
		require.Equal(t, "none", string(info.HostConfig.NetworkMode))
	})
	t.Run("named network", func(t *testing.T) {
		st, out := b.runScript(t, "net-internal", "internal", probe(peerTgt, loTgt))
		require.Equal(t, messages.StateSucceeded, st.State, "reason %q", st.Reason)
		v := values(out.stdout)
		require.Equal(t, "eth0,lo,", v["ifaces"])
		require.Equal(t, "connected", v[key(peerTgt)], "the probe works: the peer on the run's network answers")
		require.Equal(t, "failed", v[key(loTgt)], "the host's loopback is not the run's")
		info, _ := b.rt.inspect("net-internal")
		require.Equal(t, netName, string(info.HostConfig.NetworkMode))
	})
	t.Run("bridge", func(t *testing.T) {
		// No traffic: the default bridge is not the test's network.
		st, out := b.runScript(t, "net-bridge", "bridged", probe())
		require.Equal(t, messages.StateSucceeded, st.State, "reason %q", st.Reason)
		v := values(out.stdout)
		require.Equal(t, "eth0,lo,", v["ifaces"])
		require.Contains(t, v["routes"], "eth0:00000000,", "a default route")
	})

	hostMu.Lock()
	defer hostMu.Unlock()
	require.Empty(t, hostConns, "no run reached the host's listeners")
}

// startPeer starts a container on netName answering "pong" on TCP 8080
// and returns its address there.
func startPeer(t *testing.T, cli *client.Client, netName string) string {
	t.Helper()
	ctx := context.Background()
	init := true
	created, err := cli.ContainerCreate(ctx,
		&container.Config{Image: profile.SandboxImage, User: "65532:65532", Cmd: []string{"nc", "-ll", "-p", "8080", "-e", "/bin/echo", "pong"},
			Labels: map[string]string{"io.jetcrew.test": "jail"}},
		&container.HostConfig{NetworkMode: container.NetworkMode(netName), ReadonlyRootfs: true, CapDrop: []string{"ALL"},
			SecurityOpt: []string{"no-new-privileges:true"}, Init: &init},
		nil, nil, "jetcrew-test-peer-"+randomHex(t))
	require.NoError(t, err)
	t.Cleanup(func() { removeRaw(t, cli, created.ID) })
	require.NoError(t, cli.ContainerStart(ctx, created.ID, container.StartOptions{}))
	info, err := cli.ContainerInspect(ctx, created.ID)
	require.NoError(t, err)
	ep := info.NetworkSettings.Networks[netName]
	require.NotNil(t, ep)
	require.NotEmpty(t, ep.IPAddress)
	return ep.IPAddress
}

// TestJailInitReapsOrphans: PID 1 is an init (docker-init, tini) that
// reaps orphans. The command orphans 200 children, each blocked reading a
// fifo the command holds open, counts them (all alive, all children of PID
// 1), releases them all at once by closing the fifo, and execs cat, a process
// that never waits for anything: only PID 1 can reap the 200, and it does.
// (Without an init, PID 1 would be that cat and all 200 would stay zombies:
// the control subtest shows it.) A checker, started after the release, waits for the
// orphans to exit, counts zombies, and then lets cat end the run.
func TestJailInitReapsOrphans(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	b := startJail(t, jailProfile("reaper", "pids = 512"), nil)

	script := reaperScript(200)
	st, out := b.runScript(t, "reap", "reaper", script)
	require.Equal(t, messages.StateSucceeded, st.State, "reason %q stderr %s", st.Reason, out.stderr)
	v := values(out.stdout)
	require.Equal(t, "200", v["orphans"], "200 live orphans, children of PID 1: %s", out.stdout)
	require.Equal(t, "200", v["opened"], "all blocked on the gate: %s", out.stdout)
	require.Equal(t, "0", v["live"], "they all exited once released")
	require.Equal(t, "0", v["zombies"], "and PID 1 reaped every one")
	require.Equal(t, "docker-init", v["pid1"])
	require.True(t, strings.HasSuffix(string(out.stdout), "finished\n"), "the never-waiting main process ended the run")

	t.Run("control: without an init the orphans stay zombies", func(t *testing.T) {
		// The same script in the same image, jailed alike but without
		// Init: PID 1 is then the shell, which execs cat, and nobody reaps.
		// This shows the count above is the init's doing.
		out := runRaw(t, b.cli, &container.Config{Image: jailImage, User: "65532:65532", Cmd: []string{"/bin/sh", "-c", script}},
			&container.HostConfig{NetworkMode: "none", CapDrop: []string{"ALL"}, ReadonlyRootfs: true,
				SecurityOpt: []string{"no-new-privileges:true"}, Tmpfs: map[string]string{"/tmp": "size=1m,mode=1777"},
				Resources: container.Resources{PidsLimit: ptr(int64(512))}})
		v := values([]byte(out))
		require.Equal(t, "200", v["orphans"], out)
		require.Equal(t, "200", v["zombies"], out)
		require.Equal(t, "cat", v["pid1"], out)
	})
}

// reaperScript leaves n orphans (children of PID 1, blocked on a FIFO),
// releases them and reports how many stayed alive or zombies and PID 1's
// name; its main process then execs a command that never waits.
func reaperScript(n int) string {
	return fmt.Sprintf(`
mkfifo /tmp/gate /tmp/done
exec 3<>/tmp/gate
i=0; while [ $i -lt %[1]d ]; do (head -c 1 /tmp/gate >/dev/null 3>&- &); i=$((i+1)); done
orphans() { awk '/^Name:/{n=$2} /^State:/{s=$2} /^PPid:/{if(n=="head"&&$2==1&&s!="Z")c++} END{print c+0}' /proc/[0-9]*/status 2>/dev/null; }
opened() { c=0; for d in /proc/[0-9]*; do read -r n <"$d/comm" 2>/dev/null && [ "$n" = head ] && [ -e "$d/fd/3" ] && c=$((c+1)); done; echo $c; }
n=0; while [ $n -lt 100 ] && { [ "$(orphans)" != %[1]d ] || [ "$(opened)" != %[1]d ]; }; do usleep 100000; n=$((n+1)); done
echo "orphans=$(orphans) opened=$(opened)"
exec 3>&-
(
  n=0; while [ $n -lt 100 ] && [ "$(orphans)" != 0 ]; do usleep 100000; n=$((n+1)); done
  # Without an init, PID 1 is the main shell until it execs cat: let it.
  n=0; while [ $n -lt 100 ] && [ "$(cat /proc/1/comm)" = sh ]; do usleep 20000; n=$((n+1)); done
  echo "live=$(orphans) zombies=$(awk '/^State:/{if($2=="Z")c++} END{print c+0}' /proc/[0-9]*/status 2>/dev/null) pid1=$(cat /proc/1/comm)"
  echo finished >/tmp/done
) &
exec cat /tmp/done`, n)
}

func ptr[T any](v T) *T { return &v }

// TestJailTimeoutStopsWithGrace: a run that times out is stopped with
// SIGTERM first; a process that handles it exits 143 (its trap ran) within
// the grace period; one that ignores it is killed (137) only once the grace
// is over.
func TestJailTimeoutStopsWithGrace(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	const grace = 5 * time.Second
	const timeout = time.Second
	b := startJail(t, jailProfile("slow", ""), func(c *worker.Config) { c.StopGrace = grace })

	b.submit(t, "term-handled", "slow", `trap 'echo got TERM; exit 143' TERM; echo ready; sleep 60 & wait`, timeout)
	b.submit(t, "term-ignored", "slow", `trap '' TERM; echo ready; while :; do sleep 1; done`, timeout)

	st := b.waitFinal(t, "term-handled")
	require.Equal(t, messages.StateTimedOut, st.State)
	require.Equal(t, "timed out after 1s", st.Reason)
	// 143 and its trap's line prove it ended on SIGTERM, not on the
	// SIGKILL after the grace (137); how long that took is logged, not
	// asserted: under load, stopping and recording take seconds.
	require.Equal(t, 143, *st.ExitCode, "exited on SIGTERM, within the grace")
	stopped := st.FinishedAt.Sub(st.StartedAt) - timeout
	t.Logf("handled TERM: stopped %s after the timeout", stopped)
	require.Equal(t, "ready\ngot TERM\n", string(b.output(t, "term-handled").stdout))

	st = b.waitFinal(t, "term-ignored")
	require.Equal(t, messages.StateTimedOut, st.State)
	require.Equal(t, 137, *st.ExitCode, "SIGKILL after the grace")
	stopped = st.FinishedAt.Sub(st.StartedAt) - timeout
	t.Logf("ignored TERM: stopped %s after the timeout", stopped)
	require.GreaterOrEqual(t, stopped, grace, "not killed before the grace was over")
}

// TestJailExitCodes: 200 runs that exit within milliseconds, with codes 0,
// 1, 42 and 143 (the last from a real SIGTERM), each recorded with its code.
func TestJailExitCodes(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	b := startJail(t, jailProfile("quick", ""), func(c *worker.Config) { c.Concurrency = 8 })

	scripts := map[int]string{0: "exit 0", 1: "exit 1", 42: "echo bye; exit 42", 143: "kill -TERM $$"}
	codes := []int{0, 1, 42, 143}
	const n = 200
	began := time.Now()
	for i := range n {
		b.submit(t, fmt.Sprintf("code-%03d", i), "quick", scripts[codes[i%4]], time.Minute)
	}
	for i := range n {
		id := fmt.Sprintf("code-%03d", i)
		want := codes[i%4]
		st := b.waitFinal(t, id)
		require.NotNil(t, st.ExitCode, id)
		require.Equal(t, want, *st.ExitCode, id)
		require.Equal(t, 1, st.Attempts, id)
		if want == 0 {
			require.Equal(t, messages.StateSucceeded, st.State, id)
		} else {
			require.Equal(t, messages.StateFailed, st.State, id)
			require.True(t, strings.HasPrefix(st.Reason, fmt.Sprintf("exit code %d", want)), "%s: %q", id, st.Reason)
		}
	}
	t.Logf("%d runs in %s", n, time.Since(began).Round(time.Millisecond))
}

// TestJailOutput: what a run writes arrives in its output events complete,
// byte for byte, in order per stream.
//
// The engine copies stdout and stderr through separate pipes, each in its
// own goroutine, so the order between the two streams is only as good as the
// daemon's, and not asserted (see docs/jail.md).
func TestJailOutput(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	b := startJail(t, jailProfile("out", ""), nil)

	t.Run("interleaved", func(t *testing.T) {
		t.Parallel()
		st, out := b.runScript(t, "interleaved", "out", `i=0; while [ $i -lt 2000 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done`)
		require.Equal(t, messages.StateSucceeded, st.State)
		var wantOut, wantErr strings.Builder
		for i := range 2000 {
			fmt.Fprintf(&wantOut, "out%d\n", i)
			fmt.Fprintf(&wantErr, "err%d\n", i)
		}
		require.Equal(t, wantOut.String(), string(out.stdout), "stdout complete and in order")
		require.Equal(t, wantErr.String(), string(out.stderr), "stderr complete and in order")
		require.Equal(t, int64(len(out.stdout)+len(out.stderr)), st.OutputBytes)
	})
	t.Run("the issue's line", func(t *testing.T) {
		t.Parallel()
		// The worker stamps the chunks in the order it read them
		// (Jetcrew-Seq, checked by output), and each stream is complete.
		// The order across streams is the engine's: its two copies (one
		// per pipe) may already have swapped writes this close together
		// before the worker reads (docs/jail.md), so it is logged, not
		// required.
		st, out := b.runScript(t, "issue-line", "out", `echo 1; echo 2 >&2; echo 3; echo 4 >&2; exit 3`)
		require.Equal(t, messages.StateFailed, st.State)
		require.Equal(t, "1\n3\n", string(out.stdout))
		require.Equal(t, "2\n4\n", string(out.stderr))
		var got []string
		for _, c := range out.chunks {
			got = append(got, c.stream+":"+strings.ReplaceAll(strings.TrimSpace(string(c.data)), "\n", " "))
		}
		t.Logf("cross-stream order as the engine delivered it: %v", got)
	})
	t.Run("200 KiB line", func(t *testing.T) {
		t.Parallel()
		const size = 200 << 10
		st, out := b.runScript(t, "bigline", "out", fmt.Sprintf(`head -c %d /dev/zero | tr '\0' a; echo`, size))
		require.Equal(t, messages.StateSucceeded, st.State)
		require.Equal(t, strings.Repeat("a", size)+"\n", string(out.stdout))
		require.GreaterOrEqual(t, len(out.chunks), (size+messages.MaxOutputChunk-1)/messages.MaxOutputChunk)
	})
	t.Run("not UTF-8", func(t *testing.T) {
		t.Parallel()
		st, out := b.runScript(t, "binary", "out", `printf '\377\376\000\n\303('; printf '\200\000' >&2`)
		require.Equal(t, messages.StateSucceeded, st.State)
		require.Equal(t, []byte{0xff, 0xfe, 0x00, '\n', 0xc3, '('}, out.stdout)
		require.Equal(t, []byte{0x80, 0x00}, out.stderr)
	})
	t.Run("tail right before exit", func(t *testing.T) {
		t.Parallel()
		const size = 300_000
		for i := range 3 {
			id := fmt.Sprintf("tail-%d", i)
			st, out := b.runScript(t, id, "out", fmt.Sprintf(`head -c %d /dev/zero | tr '\0' x; printf END; printf LAST >&2; exit 7`, size))
			require.Equal(t, messages.StateFailed, st.State)
			require.Equal(t, 7, *st.ExitCode)
			require.Equal(t, "exit code 7: LAST", st.Reason)
			require.Len(t, out.stdout, size+3)
			require.Equal(t, strings.Repeat("x", size)+"END", string(out.stdout))
			require.Equal(t, "LAST", string(out.stderr))
		}
	})
}

// TestJailLabelsAndName: the container carries jetcrew's identity labels
// (run id, worker, creation time, installation) and the name derived from
// the run id and the delivery number, so a second container for the same
// delivery cannot be created; it is removed once the outcome is recorded.
func TestJailLabelsAndName(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	b := startJail(t, jailProfile("lab", ""), nil)
	ctx := context.Background()
	stream, err := b.js.Stream(ctx, messages.StreamRuns)
	require.NoError(t, err)
	install := strconv.FormatInt(stream.CachedInfo().Created.UnixNano(), 36)

	submitted := time.Now()
	b.submit(t, "labelled", "lab", `echo running; sleep 4; echo done`, time.Minute)
	b.waitState(t, "labelled", 30*time.Second, func(st messages.RunState) bool { return st.State == messages.StateRunning })
	info, ok := b.rt.inspect("labelled")
	require.True(t, ok)

	// jetcrew-<run id>-<request's stream sequence>-<delivery number>
	require.Regexp(t, `^/jetcrew-labelled-[0-9]+-1$`, info.Name)
	l := info.Config.Labels
	require.Equal(t, "true", l[jail.LabelManaged])
	require.Equal(t, "labelled", l[jail.LabelRunID])
	require.Equal(t, b.workerID, l[jail.LabelWorker])
	require.Equal(t, "1", l[jail.LabelAttempt])
	require.Equal(t, "lab", l[jail.LabelProfile])
	require.Equal(t, jail.RoleRun, l[jail.LabelRole])
	require.Equal(t, install, l[jail.LabelInstall])
	created, err := time.Parse(time.RFC3339Nano, l[jail.LabelCreated])
	require.NoError(t, err)
	require.WithinDuration(t, submitted, created, 30*time.Second)

	// Another container for the same delivery: refused by name.
	spec, ok := b.rt.spec("labelled")
	require.True(t, ok)
	dup, err := b.docker.Start(ctx, spec, nil)
	if err == nil {
		_ = dup.Remove(ctx)
	}
	require.ErrorIs(t, err, docker.ErrNameInUse)
	require.NotErrorIs(t, err, jail.ErrPermanent)

	st := b.waitFinal(t, "labelled")
	require.Equal(t, messages.StateSucceeded, st.State, "the refused duplicate did not disturb the run")
	require.Equal(t, info.ID, st.ContainerID)
	require.Equal(t, "running\ndone\n", string(b.output(t, "labelled").stdout))
	require.Eventually(t, func() bool {
		_, err := b.cli.ContainerInspect(ctx, info.ID)
		return cerrdefs.IsNotFound(err)
	}, 30*time.Second, 50*time.Millisecond, "the container is removed after the run")
}

// TestJailReconciler: a starting worker removes this installation's
// containers, created, running or exited, that a dead worker left behind
// once they are older than the grace; it keeps young ones, those of a live
// worker and those of another installation.
func TestJailReconciler(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	_, cli := jailDocker(t)
	ctx := context.Background()
	s := workertest.StartServer(t)
	nc := workertest.Connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = worker.Provision(ctx, js, worker.ProvisionConfig{})
	require.NoError(t, err)
	stream, err := js.Stream(ctx, messages.StreamRuns)
	require.NoError(t, err)
	install := strconv.FormatInt(stream.CachedInfo().Created.UnixNano(), 36)
	live, err := js.KeyValue(ctx, messages.BucketWorkers)
	require.NoError(t, err)
	_, err = live.Put(ctx, "alive-worker", []byte(time.Now().UTC().Format(time.RFC3339Nano)))
	require.NoError(t, err)

	old := time.Now().Add(-time.Hour)
	type orphan struct {
		state   string // created, running, exited
		owner   string
		created time.Time
		install string
		removed bool
	}
	cases := map[string]orphan{
		"created": {"created", "dead-worker", old, install, true},
		"running": {"running", "dead-worker", old, install, true},
		"exited":  {"exited", "dead-worker", old, install, true},
		"young":   {"running", "dead-worker", time.Now(), install, false},
		"alive":   {"running", "alive-worker", old, install, false},
		"foreign": {"exited", "dead-worker", old, "another-install", false},
	}
	ids := map[string]string{}
	for name, o := range cases {
		ids[name] = createLabelled(t, cli, "orphan-"+name+"-"+randomHex(t), o.state, map[string]string{
			jail.LabelManaged: "true",
			jail.LabelRunID:   "orphan-" + name,
			jail.LabelWorker:  o.owner,
			jail.LabelAttempt: "1",
			jail.LabelCreated: o.created.UTC().Format(time.RFC3339Nano),
			jail.LabelInstall: o.install,
		})
	}

	rt, _ := jailDocker(t)
	// A grace of 10 minutes: "young" must still be young when Start runs,
	// however long creating these containers took on a loaded machine
	// (38 s once, past the default 30 s); "old" is an hour old.
	w, err := worker.New(nc, worker.Config{ID: "jt-reaper-" + randomHex(t), Runtime: rt, FetchWait: 2 * time.Second, OrphanGrace: 10 * time.Minute})
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx), "Start reconciles before it pulls")
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(sctx))
	})

	for name, o := range cases {
		_, err := cli.ContainerInspect(ctx, ids[name])
		if o.removed {
			require.True(t, cerrdefs.IsNotFound(err), "%s (%s) was removed: %v", name, o.state, err)
		} else {
			require.NoError(t, err, "%s was kept", name)
		}
	}
}

// createLabelled creates a container with labels and brings it to state:
// created (never started), running (sleeping) or exited. It is removed when
// the test ends, if the reconciler has not removed it.
func createLabelled(t *testing.T, cli *client.Client, name, state string, labels map[string]string) string {
	t.Helper()
	ctx := context.Background()
	cmd := []string{"sleep", "300"}
	if state == "exited" {
		cmd = []string{"true"}
	}
	init := true
	created, err := cli.ContainerCreate(ctx,
		&container.Config{Image: profile.SandboxImage, User: "65532:65532", Cmd: cmd, Labels: labels},
		&container.HostConfig{NetworkMode: "none", ReadonlyRootfs: true, CapDrop: []string{"ALL"},
			SecurityOpt: []string{"no-new-privileges:true"}, Init: &init},
		nil, nil, "jetcrew-test-"+name)
	require.NoError(t, err)
	t.Cleanup(func() { removeRaw(t, cli, created.ID) })
	if state == "created" {
		return created.ID
	}
	waitC, errC := cli.ContainerWait(ctx, created.ID, container.WaitConditionNextExit)
	require.NoError(t, cli.ContainerStart(ctx, created.ID, container.StartOptions{}))
	if state == "exited" {
		select {
		case <-waitC:
		case err := <-errC:
			require.NoError(t, err)
		}
	}
	info, err := cli.ContainerInspect(ctx, created.ID)
	require.NoError(t, err)
	require.Equal(t, state, info.State.Status)
	return created.ID
}

// TestJailOCIRuntime: a profile that names an OCI runtime the engine does
// not have fails at once with a reason that says so, and is not retried: the
// worker refuses rather than run the agent under a weaker runtime. This is
// the per-run check (a runtime removed after the worker started): the
// recording runtime here does not list the engine's runtimes, so the start
// check (jail.OCIRuntimeLister) does not refuse the profile first. The
// success path under a second runtime is TestGVisorJail's.
func TestJailOCIRuntime(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	const missing = "jetcrew-no-such-runtime"
	b := startJail(t, jailProfile("gvisor", fmt.Sprintf("runtime = %q", missing)), nil)
	info, err := b.cli.Info(context.Background())
	require.NoError(t, err)
	var have []string
	for name := range info.Runtimes {
		have = append(have, name)
	}
	sort.Strings(have)
	require.NotContains(t, have, missing)

	st, _ := b.runScript(t, "gvisor", "gvisor", `echo hello from $(uname -r)`)
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, 1, st.Attempts, "not retried")
	require.Nil(t, st.ExitCode, "nothing ran")
	require.Equal(t, fmt.Sprintf(`docker: OCI runtime %q is not installed on this Docker engine (available: %s); `+
		`register it in the daemon's "runtimes" (daemon.json) or change the profile: permanent runtime error`,
		missing, strings.Join(have, ", ")), st.Reason)
	t.Logf("reason: %s", st.Reason)
	_, started := b.rt.inspect("gvisor")
	require.False(t, started, "no container was created")

	// The request left the work queue (dead-lettered), so it is never
	// delivered again.
	// The term follows the final state (and is not waited on), so it may
	// land a moment after the state reads failed.
	runs, err := b.js.Stream(context.Background(), messages.StreamRuns)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ri, err := runs.Info(context.Background())
		return err == nil && ri.State.Msgs == 0
	}, 15*time.Second, 20*time.Millisecond, "the request leaves the work queue")
	failed, err := b.js.Stream(context.Background(), messages.StreamFailed)
	require.NoError(t, err)
	dl, err := failed.GetLastMsgForSubject(context.Background(), messages.SubjectFailed(messages.DefaultPool, "gvisor"))
	require.NoError(t, err)
	require.Contains(t, dl.Header.Get(messages.HeaderError), fmt.Sprintf("OCI runtime %q is not installed", missing))
}
