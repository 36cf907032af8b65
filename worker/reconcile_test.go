package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

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
	fixture := []jail.ManagedContainer{
		c("active", "i1", "self", old),        // a run in flight: kept
		c("other-install", "i2", "dead", old), // another installation: kept
		c("young", "i1", "dead", young),       // inside the grace: kept
		labelled,                              // the created label wins over Created: kept
		c("live-owner", "i1", "peer", old),    // its worker is alive: kept
		c("dead-owner", "i1", "dead", old),    // its worker is gone: removed
		c("self-leftover", "i1", "self", old), // this worker's, not in flight: removed
		c("dead-owner-2", "i1", "dead", old),  // the liveness of "dead" is looked up once
	}
	var removed []string
	lookups := map[string]int{}
	swept := 0
	rc := &reconciler{
		install: "i1", self: "self", grace: time.Minute, interval: time.Hour,
		list: func(context.Context) ([]jail.ManagedContainer, error) { return fixture, nil },
		remove: func(_ context.Context, id string) error {
			removed = append(removed, id)
			if id == "dead-owner-2" {
				return errors.New("engine says no")
			}
			return nil
		},
		active: func() map[string]bool { return map[string]bool{"active": true} },
		alive: func(_ context.Context, id string) (bool, error) {
			lookups[id]++
			return id == "peer", nil
		},
		sweep: func() { swept++ },
		now:   func() time.Time { return now },
		log:   zerolog.Nop(),
	}
	err := rc.reconcile(context.Background())
	require.ErrorContains(t, err, "remove n-dead-owner-2: engine says no", "a failed removal is reported, the others still done")
	require.Equal(t, []string{"dead-owner", "self-leftover", "dead-owner-2"}, removed)
	require.Equal(t, map[string]int{"dead": 1, "peer": 1}, lookups)
	require.Equal(t, 1, swept, "each pass sweeps what the stages left (their sweepers keep what live runs hold)")

	rc.alive = func(context.Context, string) (bool, error) { return false, errors.New("kv down") }
	removed = nil
	require.ErrorContains(t, rc.reconcile(context.Background()), "look up worker peer: kv down")
	require.Empty(t, removed, "nothing is removed when liveness is unknown")
}

// TestReconcilerVolumes: volumes follow the containers' rules, and a
// volume a delivery of this worker uses is kept whatever its labels say.
func TestReconcilerVolumes(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	old, young := now.Add(-time.Hour), now.Add(-time.Second)
	v := func(name, install, owner string, created time.Time) jail.ManagedVolume {
		return jail.ManagedVolume{Name: name, Created: created,
			Labels: map[string]string{jail.LabelInstall: install, jail.LabelWorker: owner, jail.LabelRunID: "run-" + name}}
	}
	fixture := []jail.ManagedVolume{
		v("live", "i1", "self", old),           // a delivery in flight: kept
		v("other-install", "i1x", "dead", old), // another installation: kept
		v("young", "i1", "dead", young),        // inside the grace: kept
		v("live-owner", "i1", "peer", old),     // its worker is alive: kept
		v("dead-owner", "i1", "dead", old),     // removed
		v("self-leftover", "i1", "self", old),  // removed
		v("in-use", "i1", "dead", old),         // still mounted: the error is reported
	}
	var removed []string
	rc := &reconciler{
		install: "i1", self: "self", grace: time.Minute,
		list:        func(context.Context) ([]jail.ManagedContainer, error) { return nil, nil },
		active:      func() map[string]bool { return nil },
		alive:       func(_ context.Context, id string) (bool, error) { return id == "peer", nil },
		listVolumes: func(context.Context) ([]jail.ManagedVolume, error) { return fixture, nil },
		removeVolume: func(_ context.Context, name string) error {
			removed = append(removed, name)
			if name == "in-use" {
				return errors.New("volume is in use")
			}
			return nil
		},
		liveVolume: func(name string) bool { return name == "live" },
		sweep:      func() {},
		now:        func() time.Time { return now },
		log:        zerolog.Nop(),
	}
	err := rc.reconcile(context.Background())
	require.ErrorContains(t, err, "remove volume in-use: volume is in use")
	require.Equal(t, []string{"dead-owner", "self-leftover", "in-use"}, removed)
}
