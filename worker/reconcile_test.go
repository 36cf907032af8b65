package worker

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/live"
)

// fixtureRuntime is the reconciler's runtime over fixture lists: it
// records what is removed and fails the removals fail names.
type fixtureRuntime struct {
	containers []jail.ManagedContainer
	volumes    []jail.ManagedVolume
	fail       map[string]error // by container id or volume name
	removed    []string
}

func (f *fixtureRuntime) ListManaged(context.Context) ([]jail.ManagedContainer, error) {
	return f.containers, nil
}

func (f *fixtureRuntime) Remove(_ context.Context, id string) error {
	f.removed = append(f.removed, id)
	return f.fail[id]
}

func (f *fixtureRuntime) ListManagedVolumes(context.Context) ([]jail.ManagedVolume, error) {
	return f.volumes, nil
}

func (f *fixtureRuntime) RemoveVolume(_ context.Context, name string) error {
	f.removed = append(f.removed, name)
	return f.fail[name]
}

// fixtureReconciler returns the reconciler of worker "self" of
// installation "i1" at now, grace one minute, over rt and reg, its peers'
// liveness answered by alive.
func fixtureReconciler(rt *fixtureRuntime, reg *live.Registry, now time.Time, alive func(context.Context, string) (bool, error)) *reconciler {
	return newReconciler(rt, reg, alive, reconcileSettings{
		install: "i1", self: "self", grace: time.Minute, interval: time.Hour,
		now: func() time.Time { return now }, log: zerolog.Nop(),
	})
}

// TestReconcilerFixtures drives the reconciler over a fixture container
// list: which containers it removes, and which it leaves to their owners.
func TestReconcilerFixtures(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	old, young := now.Add(-time.Hour), now.Add(-time.Second)
	c := func(id, install, owner string, created time.Time) jail.ManagedContainer {
		return jail.ManagedContainer{ID: id, Name: "n-" + id, Created: created,
			Labels: map[string]string{jail.LabelInstall: install, jail.LabelWorker: owner, jail.LabelRunID: "run-" + id}}
	}
	labelled := c("labelled-young", "i1", "dead", old)
	labelled.Labels[jail.LabelCreated] = young.Format(time.RFC3339Nano)
	creating := c("creating", "i1", "self", old)
	creating.Labels[jail.LabelRunID] = "held-run"
	peerSameRun := c("peer-same-run", "i1", "dead", old)
	peerSameRun.Labels[jail.LabelRunID] = "held-run"
	rt := &fixtureRuntime{
		containers: []jail.ManagedContainer{
			c("active", "i1", "self", old),        // a run in flight: kept
			creating,                              // its run is held here (its id not known yet): kept
			c("other-install", "i2", "dead", old), // another installation: kept
			c("young", "i1", "dead", young),       // inside the grace: kept
			labelled,                              // the created label wins over Created: kept
			c("live-owner", "i1", "peer", old),    // its worker is alive: kept
			c("dead-owner", "i1", "dead", old),    // its worker is gone: removed
			c("self-leftover", "i1", "self", old), // this worker's, not in flight: removed
			c("self-young", "i1", "self", young),  // this worker's, not in flight, young: kept
			peerSameRun,                           // a dead peer's, of a run held here: removed
			c("dead-owner-2", "i1", "dead", old),  // the liveness of "dead" is looked up once
		},
		fail: map[string]error{"dead-owner-2": errors.New("engine says no")},
	}
	reg := &live.Registry{}
	reg.Hold(live.Run("run-active"), live.ContainerKey+"active")
	reg.Hold(live.Run("held-run"), live.RunKey+"held-run")
	lookups := map[string]int{}
	rc := fixtureReconciler(rt, reg, now, func(_ context.Context, id string) (bool, error) {
		lookups[id]++
		return id == "peer", nil
	})
	err := rc.reconcile(context.Background())
	require.ErrorContains(t, err, "remove n-dead-owner-2: engine says no", "a failed removal is reported, the others still done")
	require.Equal(t, []string{"dead-owner", "self-leftover", "peer-same-run", "dead-owner-2"}, rt.removed)
	require.Equal(t, map[string]int{"dead": 1, "peer": 1}, lookups)

	rc.alive = func(context.Context, string) (bool, error) { return false, errors.New("kv down") }
	rt.removed = nil
	require.ErrorContains(t, rc.reconcile(context.Background()), "look up worker peer: kv down")
	require.Empty(t, rt.removed, "nothing is removed when liveness is unknown")
}

// TestReconcilerWarm: a warm container, and the capture container made
// beside one (no run id), is the warm pool's, an owner registered here:
// held by the pool or by the run that took it over it is kept; held by
// neither, it is an orphan at once, whatever its age (a leftover of this
// worker's earlier process). Another worker's, or one of a worker whose
// pool did not register, follows the rules of every container.
func TestReconcilerWarm(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	old, young := now.Add(-time.Hour), now.Add(-time.Second)
	c := func(id, role, owner string, created time.Time) jail.ManagedContainer {
		return jail.ManagedContainer{ID: id, Name: "n-" + id, Created: created,
			Labels: map[string]string{jail.LabelInstall: "i1", jail.LabelWorker: owner, jail.LabelRole: role}}
	}
	otherInstall := c("other-install", jail.RoleWarm, "self", old)
	otherInstall.Labels[jail.LabelInstall] = "i2"
	runCapture := c("run-capture", jail.RoleCapture, "self", young)
	runCapture.Labels[jail.LabelRunID] = "r-done"
	fixture := []jail.ManagedContainer{
		c("ready", jail.RoleWarm, "self", young),               // the pool holds it by name: kept
		c("being-made", jail.RoleWarm, "self", young),          // held by name before the engine knows it: kept
		c("claimed", jail.RoleWarm, "self", old),               // the run that took it holds it by id: kept
		c("leftover", jail.RoleWarm, "self", young),            // nobody holds it: removed at once
		c("capture-held", jail.RoleCapture, "self", young),     // a warm workspace's, held: kept
		c("capture-leftover", jail.RoleCapture, "self", young), // a warm workspace's, held by nobody: removed at once
		runCapture, // a run's capture: the run's rules (young: kept)
		c("peer-young", jail.RoleWarm, "peer-dead", young), // another worker's, young: kept
		c("peer-old", jail.RoleWarm, "peer-dead", old),     // another worker's, dead and old: removed
		c("peer-live", jail.RoleWarm, "peer-live", old),    // another worker's, alive: kept
		otherInstall, // another installation: kept
		c("not-warm-young", jail.RoleEgressProof, "self", young), // the worker's own probe, young: kept
	}
	reg := &live.Registry{}
	reg.Register(live.Pool)
	reg.Hold(live.Pool, live.ContainerKey+"n-ready")
	reg.Hold(live.Pool, live.ContainerKey+"n-being-made")
	reg.Hold(live.Run("r1"), live.ContainerKey+"claimed")
	reg.Hold(live.Pool, live.ContainerKey+"n-capture-held")
	alive := func(_ context.Context, id string) (bool, error) { return id == "peer-live", nil }

	rt := &fixtureRuntime{containers: fixture}
	require.NoError(t, fixtureReconciler(rt, reg, now, alive).reconcile(context.Background()))
	require.Equal(t, []string{"leftover", "capture-leftover", "peer-old"}, rt.removed)

	// Without a registered pool (a worker whose pool is not the one
	// that made them) its own warm containers wait out the grace too.
	rt = &fixtureRuntime{containers: fixture}
	require.NoError(t, fixtureReconciler(rt, &live.Registry{}, now, alive).reconcile(context.Background()))
	require.Equal(t, []string{"claimed", "peer-old"}, rt.removed)
}

// TestReconcilerHandOverHeld: a warm container handed from the pool to a
// run is held throughout, whichever pass looks at it meanwhile.
func TestReconcilerHandOverHeld(t *testing.T) {
	t.Parallel()
	now := time.Now()
	w := jail.ManagedContainer{ID: "id1", Name: "jetcrew-warm-1", Created: now.Add(-time.Hour),
		Labels: map[string]string{jail.LabelInstall: "i1", jail.LabelWorker: "self", jail.LabelRole: jail.RoleWarm}}
	reg := &live.Registry{}
	reg.Register(live.Pool)
	releasePool := reg.Hold(live.Pool, live.ContainerKey+w.Name)
	rt := &fixtureRuntime{containers: []jail.ManagedContainer{w}}
	rc := fixtureReconciler(rt, reg, now, func(context.Context, string) (bool, error) { return false, nil })
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			_ = rc.reconcile(context.Background())
		}
	}()
	for range 1000 {
		releaseRun := reg.Hold(live.Run("r1"), live.ContainerKey+w.ID) // the run holds it...
		releasePool()                                                  // ...before the pool lets it go
		releasePool = reg.Hold(live.Pool, live.ContainerKey+w.Name)
		releaseRun()
	}
	stop.Store(true)
	<-done
	require.Empty(t, rt.removed)
}

// TestReconcilerVolumes: volumes follow the containers' rules, and a
// volume a delivery of this worker uses, or one labelled with a run it
// holds, is kept whatever its labels say.
func TestReconcilerVolumes(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	old, young := now.Add(-time.Hour), now.Add(-time.Second)
	v := func(name, install, owner string, created time.Time) jail.ManagedVolume {
		return jail.ManagedVolume{Name: name, Created: created,
			Labels: map[string]string{jail.LabelInstall: install, jail.LabelWorker: owner, jail.LabelRunID: "run-" + name}}
	}
	rt := &fixtureRuntime{
		volumes: []jail.ManagedVolume{
			v("live", "i1", "dead", old),           // a delivery in flight uses it: kept
			v("held-run", "i1", "self", old),       // labelled with a run held here: kept
			v("other-install", "i1x", "dead", old), // another installation: kept
			v("young", "i1", "dead", young),        // inside the grace: kept
			v("live-owner", "i1", "peer", old),     // its worker is alive: kept
			v("dead-owner", "i1", "dead", old),     // removed
			v("self-leftover", "i1", "self", old),  // removed
			v("in-use", "i1", "dead", old),         // still mounted: the error is reported
		},
		fail: map[string]error{"in-use": errors.New("volume is in use")},
	}
	reg := &live.Registry{}
	reg.Register(live.Pool) // no volume is the pool's by its label
	reg.Hold(live.Run("r1"), live.VolumeKey+"live")
	reg.Hold(live.Run("run-held-run"), live.RunKey+"run-held-run")
	rc := fixtureReconciler(rt, reg, now, func(_ context.Context, id string) (bool, error) { return id == "peer", nil })
	err := rc.reconcile(context.Background())
	require.ErrorContains(t, err, "remove volume in-use: volume is in use")
	require.Equal(t, []string{"dead-owner", "self-leftover", "in-use"}, rt.removed)
}

// TestSweeperSweepsEachPass: each pass sweeps what the stages left (their
// sweepers keep what live runs hold), at start and every interval.
func TestSweeperSweepsEachPass(t *testing.T) {
	t.Parallel()
	var swept atomic.Int32
	s := &sweeper{interval: 5 * time.Millisecond, sweep: func() { swept.Add(1) }}
	require.NoError(t, s.Start(context.Background()))
	require.GreaterOrEqual(t, swept.Load(), int32(1), "Start sweeps once before it returns")
	require.Eventually(t, func() bool { return swept.Load() >= 3 }, 5*time.Second, time.Millisecond)
	require.NoError(t, s.Stop(context.Background())) // its goroutine ended (TestMain's leak check)
	require.NoError(t, s.Stop(context.Background()), "a second Stop is a no-op")
}

// TestReconcilerKeepsAdoptedRunsCapture: a run's capture container, which
// holds its workspace's volume, is kept while the run's own container is,
// whatever order the engine lists them in: the run's container is judged
// first and adopted (or kept for the adoption pass). The capture container
// of a run whose container goes is judged as any container.
func TestReconcilerKeepsAdoptedRunsCapture(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	old := now.Add(-time.Hour)
	c := func(id, run, role string) jail.ManagedContainer {
		return jail.ManagedContainer{ID: id, Name: "n-" + id, Created: old, State: "running",
			Labels: map[string]string{jail.LabelInstall: "i1", jail.LabelWorker: "dead", jail.LabelRunID: run, jail.LabelRole: role}}
	}
	rt := &fixtureRuntime{containers: []jail.ManagedContainer{
		c("adopted-capture", "adopted", jail.RoleCapture),
		c("lost-capture", "lost", jail.RoleCapture),
		c("adopted-run", "adopted", jail.RoleRun),
		c("lost-run", "lost", jail.RoleRun),
	}}
	rc := fixtureReconciler(rt, &live.Registry{}, now, func(context.Context, string) (bool, error) { return false, nil })
	var asked []string
	rc.adopt = func(_ context.Context, c jail.ManagedContainer) (adoptVerdict, error) {
		asked = append(asked, c.ID)
		if c.Labels[jail.LabelRunID] == "adopted" {
			return keepIt, nil
		}
		return orphanRules, nil
	}
	require.NoError(t, rc.reconcile(context.Background()))
	require.Equal(t, []string{"adopted-run", "lost-run"}, asked, "only runs' own containers are offered for adoption")
	require.Equal(t, []string{"lost-run", "lost-capture"}, rt.removed)
}

// TestReconcilerOffersRunsBeingDecided: a run's container labelled with
// this worker's id, while a delivery of the run is being decided here (a
// redelivery asking who holds the run: live.RunKey held, the container
// not), is offered for adoption when the worker's earlier process made it,
// so that a restarted worker's adoption pass is not lost to a redelivery
// arriving with it; it is kept whatever the adopt hook says, as is every
// other container of the run's, and the run's volume.
func TestReconcilerOffersRunsBeingDecided(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	labels := func(role string) map[string]string {
		return map[string]string{jail.LabelInstall: "i1", jail.LabelWorker: "self", jail.LabelRunID: "r1", jail.LabelRole: role}
	}
	for _, says := range []adoptVerdict{keepIt, orphanRules, removeIt} {
		rt := &fixtureRuntime{
			containers: []jail.ManagedContainer{
				{ID: "run", Name: "n-run", Created: now.Add(-time.Hour), State: "running", Labels: labels(jail.RoleRun)},
				{ID: "capture", Name: "n-capture", Created: now.Add(-time.Hour), State: "running", Labels: labels(jail.RoleCapture)},
			},
			volumes: []jail.ManagedVolume{{Name: "vol", Created: now.Add(-time.Hour), Labels: labels(jail.RoleRun)}},
		}
		reg := &live.Registry{}
		release := reg.Hold(live.Run("r1"), live.RunKey+"r1") // the delivery
		rc := fixtureReconciler(rt, reg, now, func(context.Context, string) (bool, error) { return false, nil })
		var asked []string
		rc.adopt = func(_ context.Context, c jail.ManagedContainer) (adoptVerdict, error) {
			asked = append(asked, c.ID)
			return says, nil
		}
		require.NoError(t, rc.reconcile(context.Background()))
		require.Equal(t, []string{"run"}, asked, "the run's own container is offered for adoption")
		require.Empty(t, rt.removed, "nothing of a run a delivery decides is removed (the hook said %d)", says)

		// One this process made (the delivery's own, being started) is
		// not offered.
		asked = nil
		rt.containers[0].Created = now.Add(time.Second)
		require.NoError(t, rc.reconcile(context.Background()))
		require.Empty(t, asked)
		require.Empty(t, rt.removed)
		release()
	}
}
