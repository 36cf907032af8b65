package runner

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/live"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/stage/bridge"
	"github.com/jetcrew/jetcrew/worker/stage/coord"
	"github.com/jetcrew/jetcrew/worker/stage/rundir"
	"github.com/jetcrew/jetcrew/worker/stage/secrets"
	"github.com/jetcrew/jetcrew/worker/stage/tree"
	"github.com/jetcrew/jetcrew/worker/warm"
	"github.com/jetcrew/jetcrew/worker/workertest"
	"github.com/jetcrew/jetcrew/workspace"
)

// jailView is a container's jail as a placement must keep it: everything
// but what a hand-off binds late (name, command, environment, working
// directory, labels), its mounts by target with their role and access,
// without host paths.
type jailView struct {
	Image       string           `json:"image"`
	User        string           `json:"user"`
	Network     string           `json:"network"`
	OCIRuntime  string           `json:"oci_runtime"`
	MemoryBytes int64            `json:"memory_bytes"`
	NanoCPUs    int64            `json:"nano_cpus"`
	PidsLimit   int64            `json:"pids_limit"`
	Tmpfs       jail.TmpfsMounts `json:"tmpfs"`
	Mounts      []mountView      `json:"mounts"`
}

// mountView is one mount of a jailView: its role is the receipt's of the
// run at its target ("" when the run has no mount there).
type mountView struct {
	Target   string `json:"target"`
	Role     string `json:"role"`
	ReadOnly bool   `json:"read_only"`
	Volume   bool   `json:"volume,omitempty"`
}

// viewOf returns spec's jailView, the roles of its mounts read from the
// receipt mounts of a run.
func viewOf(spec jail.ContainerSpec, roles []messages.ReceiptMount) jailView {
	v := jailView{Image: spec.Image, User: spec.User, Network: spec.Network, OCIRuntime: spec.OCIRuntime,
		MemoryBytes: spec.MemoryBytes, NanoCPUs: spec.NanoCPUs, PidsLimit: spec.PidsLimit, Tmpfs: spec.Tmpfs}
	for _, m := range spec.Mounts {
		mv := mountView{Target: m.Target, ReadOnly: m.ReadOnly, Volume: m.Volume}
		if i := slices.IndexFunc(roles, func(r messages.ReceiptMount) bool { return r.Target == m.Target }); i >= 0 {
			mv.Role = roles[i].Role
		}
		v.Mounts = append(v.Mounts, mv)
	}
	slices.SortFunc(v.Mounts, func(a, b mountView) int { return strings.Compare(a.Target, b.Target) })
	return v
}

// placed is one run prepared by the engine under a placement: its cold
// container spec and receipt, its placement's kind and, for a warm one,
// whether the claimed container still takes the run after prepare's
// check (Verify).
type placed struct {
	spec    jail.ContainerSpec
	receipt *messages.Receipt
	kind    stage.PlacementKind
	takes   bool
}

// placementBed is the engine with the real stages a run of the reference
// profiles uses, over the fake runtime and an embedded NATS server, and a
// warm pool made by the engine's make function (Stages.MakeWarm).
type placementBed struct {
	rt     *workertest.Runtime
	stages Stages
	live   *live.Registry
	pool   *warm.Pool
	ref    messages.WorkspaceRef
	seq    uint64
}

func newPlacementBed(t *testing.T, ps profile.Profiles) *placementBed {
	t.Helper()
	ctx := context.Background()
	s := workertest.StartServer(t)
	nc := workertest.Connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	rt := workertest.NewTestRuntime(t)
	state := workertest.StateDir(t)
	for _, d := range []string{"r", "p"} {
		require.NoError(t, os.MkdirAll(filepath.Join(state, d), 0o700))
	}
	lv := &live.Registry{}
	holds := lv.For(live.Worker)
	host, err := coordination.NewHost(nc, coordination.Config{})
	require.NoError(t, err)
	set := profile.NewSet(ps)
	trees := tree.New(tree.Deps{Config: tree.Config{}.WithDefaults(1), Runtime: rt, JS: js, StateDir: state, Tool: workertest.BridgeFile(t),
		StopGrace: time.Second, Holds: holds, Log: zerolog.Nop(), Profiles: set,
		RunState: func(context.Context, string) (messages.RunState, error) { return messages.RunState{}, nil }})
	require.NoError(t, trees.Start(ctx))
	t.Cleanup(func() { _ = trees.Stop(ctx) })
	_, _, err = trees.EnsureBuckets(ctx)
	require.NoError(t, err)
	b := &placementBed{rt: rt, live: lv, stages: Stages{
		Secrets: secrets.New(func(string) (string, bool) { return "sk-secret", true }),
		RunDirs: rundir.New(filepath.Join(state, "r"), filepath.Join(state, "p"), 0, holds, zerolog.Nop()),
		Bridges: bridge.New(workertest.BridgeFile(t), filepath.Join(state, "bin"), holds),
		Trees:   trees, Coord: coord.New(host),
	}}
	b.pool = warm.New(warm.Config{Runtime: rt, Profiles: set, WorkerID: "w", Install: "i", Pool: "default", Max: 2 * len(ps),
		Make: b.stages.MakeWarm, Workspaces: true, Live: lv, Registry: prometheus.NewRegistry(), Log: zerolog.Nop()})
	require.NoError(t, b.pool.Start(ctx))
	t.Cleanup(func() { _ = b.pool.Stop(ctx) })

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.txt"), []byte("one\n"), 0o644))
	wsb, _, err := workspace.EnsureBuckets(ctx, js, workspace.BucketConfig{})
	require.NoError(t, err)
	up, err := workspace.Upload(ctx, wsb, dir, workspace.SnapshotOptions{})
	require.NoError(t, err)
	b.ref = up.Ref
	return b
}

// full waits until every pool the profiles ask for holds its containers.
func (b *placementBed) full(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, st := range b.pool.Status() {
			if st.Ready < st.Target {
				return false
			}
		}
		return len(b.pool.Status()) > 0
	}, 20*time.Second, 5*time.Millisecond, "%+v", b.pool.Status())
}

// prepare has the engine prepare a run of prof (with a workspace when ws
// is set), warm placements allowed when pool is set, and releases it.
func (b *placementBed) prepare(t *testing.T, prof *profile.Profile, ws, pool bool) placed {
	t.Helper()
	cfg := Config{Runtime: b.rt, Stages: b.stages, Live: b.live, DefaultTimeout: time.Hour, StopGrace: time.Second, WorkerID: "w", Log: zerolog.Nop()}
	if pool {
		cfg.Warm = b.pool
	}
	b.seq++
	req := messages.RunRequest{ID: "r1", Profile: prof.Name, Prompt: "fix the bug", Group: "g"}.WithDefaults()
	if ws {
		req.Workspace = &b.ref
	}
	r := &run{e: New(cfg), req: req, log: zerolog.Nop(),
		meta: &jetstream.MsgMetadata{NumDelivered: 1, Sequence: jetstream.SequencePair{Stream: b.seq}, Timestamp: time.Now()}}
	p, err := r.prepare(context.Background(), prof)
	require.NoError(t, err)
	got := placed{spec: p.spec, receipt: r.rec.st.Receipt, kind: r.place.st.Kind, takes: r.place.claimed != nil}
	r.release(true)
	return got
}

// warmSpec returns the spec of the warm container the pool made for
// profile name's runs with a workspace (ws) or without.
func (b *placementBed) warmSpec(t *testing.T, name string, ws bool) jail.ContainerSpec {
	t.Helper()
	for _, s := range b.rt.Starts() {
		hasWS := slices.ContainsFunc(s.Mounts, func(m jail.Mount) bool { return m.Target == messages.WorkspaceDir })
		if s.Labels[jail.LabelRole] == jail.RoleWarm && s.Labels[jail.LabelProfile] == name && hasWS == ws {
			return s
		}
	}
	t.Fatalf("no warm container of %s (workspace %v) was made", name, ws)
	return jail.ContainerSpec{}
}

// placementGolden is a backend's jail, the same under every placement,
// for runs without a workspace and with one.
type placementGolden struct {
	Jail          jailView `json:"jail"`
	WorkspaceJail jailView `json:"workspace_jail"`
}

// TestPlacementJailGolden: for every backend's reference profile and
// both placements, runs without a workspace and with one, the engine
// prepares the same jail (mounts by role, target and access, user,
// limits, runtime, network, tmpfs) as the warm container the pool made
// with the engine's make function (Stages.MakeWarm) has, and the warm
// container takes the run; the command line, working directory and
// environment a cold start creates are the ones a warm container is
// handed. A stage that adds a mount to a cold run and not to a warm
// container fails here, instead of turning every warm run cold. The jail
// of each backend is in testdata/placement-<backend>.json (-update).
func TestPlacementJailGolden(t *testing.T) {
	t.Parallel()
	ps := profile.Profiles{}
	for _, be := range profile.Backends() {
		p := profile.Profile{Name: "ref-" + be, JailConfig: profile.JailConfig{Image: "agents:ref"},
			AgentConfig: profile.AgentConfig{Backend: be, EnvFromHost: []string{"API_KEY"}}}
		p.Warm, p.WarmWorkspace = 1, 1
		if be == profile.BackendCommand {
			p.Command = []string{"/bin/sh", "-c", "{prompt}"}
		}
		p, err := p.Resolve()
		require.NoError(t, err)
		ps[p.Name] = p
	}
	b := newPlacementBed(t, ps)
	for _, be := range profile.Backends() {
		prof := ps["ref-"+be]
		var g placementGolden
		for _, ws := range []bool{false, true} {
			b.full(t)
			cold := b.prepare(t, &prof, ws, false)
			require.Equal(t, stage.PlacementCold, cold.kind)
			w := b.prepare(t, &prof, ws, true)
			require.Equal(t, stage.PlacementWarm, w.kind, "%s (workspace %v): a warm container was claimed", be, ws)
			container := b.warmSpec(t, prof.Name, ws)

			coldView := viewOf(cold.spec, cold.receipt.Mounts)
			require.Equal(t, coldView, viewOf(container, w.receipt.Mounts),
				"%s (workspace %v): the warm container's jail is a cold run's", be, ws)
			require.Equal(t, coldView, viewOf(w.spec, w.receipt.Mounts), "%s (workspace %v): a warm run's jail is a cold run's", be, ws)
			require.True(t, w.takes, "%s (workspace %v): the warm container takes the run (Verify)", be, ws)
			// What a hand-off binds late is what a cold start creates.
			require.Equal(t, cold.spec.Cmd, w.spec.Cmd, "%s (workspace %v): argv", be, ws)
			require.Equal(t, cold.spec.WorkingDir, w.spec.WorkingDir, be)
			require.Equal(t, cold.spec.Env, w.spec.Env, be)
			require.Equal(t, messages.ContainerBridgePath, container.Cmd[0], "the warm container's launcher is the bridge")
			if ws {
				g.WorkspaceJail = coldView
			} else {
				g.Jail = coldView
			}
		}
		requireGolden(t, "placement-"+be+".json", g, be)
	}
}

// A run whose prepare fails after it claimed a warm container (a stage
// after the run directory's refuses it) leaves nothing: the container is
// removed once, the run directory taken from it is removed, and a second
// release does nothing.
func TestPlacementPrepareFailsAfterAcquire(t *testing.T) {
	t.Parallel()
	p := profile.Profile{Name: "ref", JailConfig: profile.JailConfig{Image: "agents:ref"},
		AgentConfig: profile.AgentConfig{Backend: profile.BackendClaude, EnvFromHost: []string{"API_KEY"}}}
	p.Warm = 1
	p, err := p.Resolve()
	require.NoError(t, err)
	b := newPlacementBed(t, profile.Profiles{p.Name: p})
	b.full(t)
	stages := b.stages
	stages.Secrets = secrets.New(func(string) (string, bool) { return "", false }) // API_KEY unset: the secrets stage refuses
	cfg := Config{Runtime: b.rt, Stages: stages, Live: b.live, DefaultTimeout: time.Hour, StopGrace: time.Second, WorkerID: "w", Log: zerolog.Nop(), Warm: b.pool}
	req := messages.RunRequest{ID: "r1", Profile: p.Name, Prompt: "fix the bug", Group: "g"}.WithDefaults()
	r := &run{e: New(cfg), req: req, log: zerolog.Nop(),
		meta: &jetstream.MsgMetadata{NumDelivered: 1, Sequence: jetstream.SequencePair{Stream: 1}, Timestamp: time.Now()}}
	_, err = r.prepare(context.Background(), &p)
	require.Error(t, err)
	require.True(t, r.sr.Placement.Warm())
	require.NotNil(t, r.place.claimed)
	name := r.place.claimed.Name()
	dir := r.stages[0].(*rundir.Stage).Path()
	require.DirExists(t, dir, "the run took the warm container's directory over")
	before, err := b.rt.ListManaged(context.Background())
	require.NoError(t, err)
	require.True(t, slices.ContainsFunc(before, func(m jail.ManagedContainer) bool { return m.Name == name }))
	r.release(true)
	r.release(true)
	r.place.release(context.Background())
	managed, err := b.rt.ListManaged(context.Background())
	require.NoError(t, err)
	for _, m := range managed {
		require.NotEqual(t, name, m.Name, "the claimed warm container is removed")
	}
	require.NoDirExists(t, dir)
}
