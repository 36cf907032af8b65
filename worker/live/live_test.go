package live_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/worker/live"
)

// TestRegistryOwners: a key is held while any owner holds it, each owner's
// holds counted apart; a release given twice counts once.
func TestRegistryOwners(t *testing.T) {
	t.Parallel()
	var r live.Registry
	name := live.ContainerKey + "jetcrew-warm-1"
	releasePool := r.Hold(live.Pool, name)
	require.True(t, r.Held(name))
	require.True(t, r.HeldBy(live.Pool, name))
	require.False(t, r.HeldBy(live.Run("r1"), name))

	releaseRun := r.Hold(live.Run("r1"), name)
	releasePool()
	releasePool() // a second release changes nothing
	require.True(t, r.Held(name), "the run holds it still")
	require.False(t, r.HeldBy(live.Pool, name))
	releaseRun()
	require.False(t, r.Held(name))

	again := r.Hold(live.Worker, name)
	again2 := r.Hold(live.Worker, name)
	again()
	require.True(t, r.Held(name), "one of two holds of one owner is left")
	again2()
	require.False(t, r.Held(name))
}

// TestRegistryHeldAny: Held asks every key at once, so a container whose
// run holds its id before the pool lets its name go is held throughout.
func TestRegistryHeldAny(t *testing.T) {
	t.Parallel()
	var r live.Registry
	byName, byID := live.ContainerKey+"jetcrew-warm-1", live.ContainerKey+"abc123"
	require.False(t, r.Held(byName, byID))
	pool := r.Hold(live.Pool, byName)
	require.True(t, r.Held(byName, byID))
	run := r.Hold(live.Run("r1"), byID)
	pool()
	require.True(t, r.Held(byName, byID))
	run()
	require.False(t, r.Held(byName, byID))
	require.False(t, r.Held())
}

// TestRegistryIfUnheldAndKeys: a sweeper removes only what nobody holds;
// Keys lists the held keys of a prefix, whoever holds them.
func TestRegistryIfUnheldAndKeys(t *testing.T) {
	t.Parallel()
	var r live.Registry
	release := r.Hold(live.Run("r1"), "bridge:aaa")
	r.Hold(live.Pool, "bridge:bbb")
	r.Hold(live.Worker, "dir:/x")
	require.Equal(t, map[string]bool{"aaa": true, "bbb": true}, r.Keys("bridge:"))
	called := false
	require.False(t, r.IfUnheld("bridge:aaa", func() { called = true }))
	require.False(t, called)
	release()
	require.True(t, r.IfUnheld("bridge:aaa", func() { called = true }))
	require.True(t, called)
	require.Equal(t, map[string]bool{"bbb": true}, r.Keys("bridge:"))
}

// TestRegistryRegistered: only an owner that registered is known to hold
// everything of its own.
func TestRegistryRegistered(t *testing.T) {
	t.Parallel()
	var r live.Registry
	require.False(t, r.Registered(live.Pool))
	r.Register(live.Pool)
	require.True(t, r.Registered(live.Pool))
	require.False(t, r.Registered(live.Worker))
	require.False(t, r.Registered(live.Run("r1")))
}

// TestHoldsView: a view holds as its owner into its registry; the zero
// value holds as the worker into a registry of its own.
func TestHoldsView(t *testing.T) {
	t.Parallel()
	var r live.Registry
	h := r.For(live.Run("r1"))
	require.Equal(t, live.Run("r1"), h.Owner())
	require.Same(t, &r, h.Registry())
	release := h.Hold("dir:/a")
	require.True(t, r.HeldBy(live.Run("r1"), "dir:/a"))
	require.True(t, r.For(live.Worker).Held("dir:/a"), "a view asks of every owner's holds")
	release()
	require.False(t, h.Held("dir:/a"))

	var zero live.Holds
	require.Equal(t, live.Worker, zero.Owner())
	zr := zero.Hold("k")
	require.True(t, zero.Held("k"))
	require.Equal(t, map[string]bool{"k": true}, zero.Keys(""))
	require.False(t, zero.IfUnheld("k", func() {}))
	zr()
	require.False(t, r.Held("k"), "the zero value's registry is its own")
}
