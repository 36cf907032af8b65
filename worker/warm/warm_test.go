package warm_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/runner"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/stage/bridge"
	"github.com/jetcrew/jetcrew/worker/stage/rundir"
	"github.com/jetcrew/jetcrew/worker/warm"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// imageIDs is a mutable image id for the fake runtime's Images.
type imageIDs struct {
	mu sync.Mutex
	id string
}

func (i *imageIDs) get(string) string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.id
}

func (i *imageIDs) set(id string) {
	i.mu.Lock()
	i.id = id
	i.mu.Unlock()
}

// newPool returns a started pool of profiles (TOML) over rt, stopped when
// the test ends.
func newPool(t *testing.T, rt jail.Runtime, toml string, mod func(*warm.Config)) *warm.Pool {
	t.Helper()
	ps, err := profile.ParseProfiles("p.toml", []byte(toml))
	require.NoError(t, err)
	return newPoolOf(t, rt, ps, mod)
}

// newPoolOf returns a started pool of profiles ps over rt, stopped when
// the test ends.
func newPoolOf(t *testing.T, rt jail.Runtime, ps profile.Profiles, mod func(*warm.Config)) *warm.Pool {
	t.Helper()
	state := workertest.StateDir(t)
	holds := &stage.Holds{}
	for _, d := range []string{"r", "p"} {
		require.NoError(t, os.MkdirAll(filepath.Join(state, d), 0o700))
	}
	stages := runner.Stages{
		RunDirs: rundir.New(filepath.Join(state, "r"), filepath.Join(state, "p"), 0, holds, zerolog.Nop()),
		Bridges: bridge.New(workertest.BridgeFile(t), filepath.Join(state, "bin"), holds),
	}
	cfg := warm.Config{
		Runtime: rt, Profiles: profile.NewSet(ps), WorkerID: "w1", Install: "i1", Pool: "default", Make: stages.MakeWarm,
		Registry: prometheus.NewRegistry(), Log: zerolog.Nop(),
	}
	if mod != nil {
		mod(&cfg)
	}
	p := warm.New(cfg)
	require.NoError(t, p.Start(context.Background()))
	t.Cleanup(func() { p.Stop(context.Background()) })
	return p
}

// ready waits until profile's pool holds n ready containers.
func ready(t *testing.T, p *warm.Pool, profile string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, st := range p.Status() {
			if st.Profile == profile {
				return st.Ready == n
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "pool %s never held %d ready: %+v", profile, n, p.Status())
}

const twoProfiles = `
[profiles.a]
image = "img"
command = ["/bin/sh", "-c", "{prompt}"]
warm = 3
[profiles.b]
image = "img"
command = ["/bin/sh", "-c", "{prompt}"]
warm = 3
[profiles.cold]
image = "img"
command = ["/bin/sh", "-c", "{prompt}"]
`

// --warm-max bounds the containers over all profiles, filled in name
// order; a profile without warm gets none and a claim of it is nil.
func TestPoolMaxFillsInNameOrder(t *testing.T) {
	t.Parallel()
	rt := workertest.NewTestRuntime(t)
	p := newPool(t, rt, twoProfiles, func(c *warm.Config) { c.Max = 4 })
	ready(t, p, "a", 3)
	ready(t, p, "b", 1)
	require.Equal(t, []messages.WarmPool{{Profile: "a", Target: 3, Ready: 3}, {Profile: "b", Target: 1, Ready: 1}}, p.Status())
	cold := p.Claim(&profile.Profile{Name: "cold"}, false)
	require.Nil(t, cold)
	for _, s := range rt.Starts() {
		require.Equal(t, jail.RoleWarm, s.Labels[jail.LabelRole])
		require.Empty(t, s.Labels[jail.LabelRunID], "a warm container belongs to no run")
		require.Equal(t, []string{messages.ContainerBridgePath, "launch", "--handoff", messages.ContainerHandoffPath}, s.Cmd)
		require.True(t, p.Owns(s.Name))
	}
	require.Len(t, rt.Starts(), 4, "each of the pool's four started containers it holds")
}

// A claimed container matches the jail of a run's spec built from its
// profile, whatever the run's name, command, environment, working
// directory, labels and run directory; another limit, image or mount does
// not match. Handing it a run hands the launcher the run's command line;
// a claim is refilled.
func TestClaimMatchHandoff(t *testing.T) {
	t.Parallel()
	rt := workertest.NewTestRuntime(t)
	p := newPool(t, rt, twoProfiles, func(c *warm.Config) { c.Max = 1 })
	ready(t, p, "a", 1)
	ps, err := profile.ParseProfiles("p.toml", []byte(twoProfiles))
	require.NoError(t, err)
	prof := ps["a"]
	c := p.Claim(&prof, false)
	require.NotNil(t, c)
	require.DirExists(t, c.Dir())

	warmSpec := rt.Starts()[0]
	run := runner.ProfileSpec(&prof)
	run.Name, run.Cmd, run.Env, run.WorkingDir = "jetcrew-r1-1-1", []string{"/bin/sh", "-c", "out hi"}, []string{"JETCREW_RUN_ID=r1", "HOME=/home/agent"}, "/work"
	run.Labels = map[string]string{jail.LabelRunID: "r1"}
	run.Mounts = []jail.Mount{warmSpec.Mounts[1], {Source: "/elsewhere/r1", Target: messages.ContainerRunDir, ReadOnly: true}}
	require.NoError(t, c.Matches(run), "mount order, run directory and late-bound fields do not count")

	for name, change := range map[string]func(*jail.ContainerSpec){
		"memory":   func(s *jail.ContainerSpec) { s.MemoryBytes++ },
		"image":    func(s *jail.ContainerSpec) { s.Image = "other" },
		"user":     func(s *jail.ContainerSpec) { s.User = "1:1" },
		"network":  func(s *jail.ContainerSpec) { s.Network = "bridge" },
		"runtime":  func(s *jail.ContainerSpec) { s.OCIRuntime = "runsc" },
		"mount":    func(s *jail.ContainerSpec) { s.Mounts = append(s.Mounts, jail.Mount{Source: "/x", Target: "/y"}) },
		"bridge":   func(s *jail.ContainerSpec) { s.Mounts[0].Source += "-rebuilt" },
		"tmpfs":    func(s *jail.ContainerSpec) { s.Tmpfs[0].SizeBytes++ },
		"readonly": func(s *jail.ContainerSpec) { s.Mounts[1].ReadOnly = false },
	} {
		other := run
		other.Mounts = append([]jail.Mount(nil), run.Mounts...)
		other.Tmpfs = append(jail.TmpfsMounts(nil), run.Tmpfs...)
		change(&other)
		require.Error(t, c.Matches(other), name)
	}

	var got sync.Map
	ctr, err := c.Handoff(context.Background(), run, func(stream string, b []byte) { got.Store(stream, string(b)) })
	require.NoError(t, err)
	c.Handed()
	require.False(t, p.Owns(warmSpec.Name), "the run holds it now")
	st, err := ctr.Wait(context.Background())
	require.NoError(t, err)
	require.Zero(t, st.Code)
	out, _ := got.Load("stdout")
	require.Equal(t, "hi\n", out, "the run's command ran, its output the run's")
	hs := rt.Handoffs()
	require.Len(t, hs, 1)
	require.Equal(t, run.Cmd, hs[0].Cmd)
	require.Equal(t, "/work", hs[0].WorkingDir)
	require.Contains(t, hs[0].Env, "JETCREW_RUN_ID=r1")
	require.NoError(t, rt.Remove(context.Background(), ctr.ID()))
	ready(t, p, "a", 1) // refilled
	require.Len(t, rt.Starts(), 2)
}

// A claimed container given back unused is removed with its directory.
func TestDiscard(t *testing.T) {
	t.Parallel()
	rt := workertest.NewTestRuntime(t)
	p := newPool(t, rt, twoProfiles, func(c *warm.Config) { c.Max = 1 })
	ready(t, p, "a", 1)
	ps, err := profile.ParseProfiles("p.toml", []byte(twoProfiles))
	require.NoError(t, err)
	prof := ps["a"]
	c := p.Claim(&prof, false)
	require.NotNil(t, c)
	dir := c.Dir()
	c.Discard(context.Background())
	require.NoDirExists(t, dir)
	require.False(t, p.Owns(c.Name()))
	ready(t, p, "a", 1)
	require.Equal(t, 1, rt.Live(), "the discarded one is gone; its replacement waits")
}

// A container that waited past MaxIdle, or whose profile's image id
// changed, is replaced; Stop removes every ready container.
func TestReplacedWhenIdleOrImageChanged(t *testing.T) {
	t.Parallel()
	t.Run("idle", func(t *testing.T) {
		t.Parallel()
		rt := workertest.NewTestRuntime(t)
		p := newPool(t, rt, twoProfiles, func(c *warm.Config) {
			c.Max, c.MaxIdle, c.CheckEvery = 1, 50*time.Millisecond, 20*time.Millisecond
		})
		require.Eventually(t, func() bool { return len(rt.Starts()) >= 3 }, 10*time.Second, 10*time.Millisecond,
			"idle containers are replaced, again and again")
		p.Stop(context.Background())
		require.Zero(t, rt.Live(), "Stop leaves no container")
	})
	t.Run("image", func(t *testing.T) {
		t.Parallel()
		ids := &imageIDs{id: "sha256:old"}
		rt := workertest.NewTestRuntime(t)
		rt.Images = ids.get
		p := newPool(t, rt, twoProfiles, func(c *warm.Config) { c.Max, c.CheckEvery = 1, 20*time.Millisecond })
		ready(t, p, "a", 1)
		time.Sleep(100 * time.Millisecond) // several checks find the same image
		require.Len(t, rt.Starts(), 1, "a container on the current image is kept")
		ids.set("sha256:new") // the image was rebuilt
		require.Eventually(t, func() bool { return len(rt.Starts()) == 2 }, 10*time.Second, 10*time.Millisecond)
		ready(t, p, "a", 1)
		require.Equal(t, 1, rt.Live(), "the old image's container is gone")
		time.Sleep(100 * time.Millisecond)
		require.Len(t, rt.Starts(), 2, "the new one is kept")
	})
}

// A launcher that does not answer the probe before its hand-off (its
// container paused, or it stopped) is never handed the run: Handoff
// fails within Config.ProbeTimeout with ErrUnresponsive (reason
// "unresponsive"), and nothing of the run reached the launcher.
func TestHandoffProbeUnanswered(t *testing.T) {
	t.Parallel()
	rt := workertest.NewTestRuntime(t)
	p := newPool(t, rt, twoProfiles, func(c *warm.Config) { c.Max, c.ProbeTimeout = 1, 200*time.Millisecond })
	ready(t, p, "a", 1)
	ps, err := profile.ParseProfiles("p.toml", []byte(twoProfiles))
	require.NoError(t, err)
	prof := ps["a"]
	c := p.Claim(&prof, false)
	require.NotNil(t, c)
	rt.Pause(c.ContainerID())
	run := runner.ProfileSpec(&prof)
	run.Cmd = []string{"/bin/sh", "-c", "out hi"}
	start := time.Now()
	_, err = c.Handoff(context.Background(), run, func(string, []byte) {})
	require.ErrorIs(t, err, warm.ErrUnresponsive)
	require.Equal(t, "unresponsive", warm.Reason(err))
	require.Less(t, time.Since(start), time.Second, "within the probe's timeout")
	rt.Unpause(c.ContainerID())
	p.GaveBack(c, warm.Reason(err))
	c.Discard(context.Background())
	require.Empty(t, rt.Handoffs(), "the launcher was never handed the run")
	ready(t, p, "a", 1)
}

// runSpec returns the spec of a cold container of a run of prof with the
// jail of warm container c (its mounts), as the engine's prepare builds
// one.
func runSpec(t *testing.T, rt *workertest.Runtime, c *warm.Container, prof *profile.Profile) jail.ContainerSpec {
	t.Helper()
	spec := runner.ProfileSpec(prof)
	for _, s := range rt.Starts() {
		if s.Name == c.Name() {
			spec.Mounts = s.Mounts
			return spec
		}
	}
	t.Fatalf("warm container %s was never started", c.Name())
	return spec
}

// A claim checks the profile's image reference against the container's
// image: once the reference names another image, Verify fails with
// ErrImageChanged (reason "image") and the pool's other ready containers
// of the old image are replaced at once; containers of the new image
// pass. A container made for workspace runs is checked within the claim
// itself (nil: the run starts cold), its run's stages never taking over
// one of the old image.
func TestClaimChecksImage(t *testing.T) {
	t.Parallel()
	const toml = `
[profiles.a]
image = "img"
command = ["/bin/sh", "-c", "{prompt}"]
warm = 3
warm_workspace = 1
`
	ids := &imageIDs{id: "sha256:old"}
	rt := workertest.NewTestRuntime(t)
	rt.Images = ids.get
	p := newPool(t, rt, toml, func(c *warm.Config) {
		c.Max = 4
		// Containers for workspace runs, made as those for runs without.
		mk := c.Make
		c.Make, c.Workspaces = func(ctx context.Context, req warm.MakeRequest) (warm.Made, error) {
			req.Workspace = false
			return mk(ctx, req)
		}, true
	})
	ps, err := profile.ParseProfiles("p.toml", []byte(toml))
	require.NoError(t, err)
	prof := ps["a"]
	full := func() {
		t.Helper()
		require.Eventually(t, func() bool {
			st := p.Status()
			return len(st) == 2 && st[0].Ready == 3 && st[1].Ready == 1
		}, 10*time.Second, 5*time.Millisecond, "%+v", p.Status())
	}
	full()

	c := p.Claim(&prof, false)
	require.NotNil(t, c)
	require.NoError(t, c.Verify(context.Background(), runSpec(t, rt, c, &prof)), "the same image")
	c.Discard(context.Background())
	full()

	ids.set("sha256:new")
	old := rt.Starts()
	c = p.Claim(&prof, false)
	require.NotNil(t, c)
	err = c.Verify(context.Background(), runSpec(t, rt, c, &prof))
	require.ErrorIs(t, err, warm.ErrImageChanged)
	require.Equal(t, "image", warm.Reason(err))
	p.GaveBack(c, warm.Reason(err))
	c.Discard(context.Background())
	full()
	for _, s := range old {
		require.False(t, p.Owns(s.Name), "%s, of the old image, is replaced", s.Name)
	}
	c = p.Claim(&prof, false)
	require.NotNil(t, c)
	require.NoError(t, c.Verify(context.Background(), runSpec(t, rt, c, &prof)), "a container of the new image")
	c.Discard(context.Background())
	full()

	ids.set("sha256:newer")
	require.True(t, p.Claim(&prof, true) == nil, "a workspace container of the old image is not claimed")
	full()
	c = p.Claim(&prof, true)
	require.NotNil(t, c, "its replacement, of the new image, is")
	c.Discard(context.Background())
}
