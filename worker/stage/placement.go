package stage

import (
	"sync/atomic"

	"github.com/jetcrew/jetcrew/worker/jail"
)

// PlacementKind names where a run's container comes from.
type PlacementKind string

// The kinds of placement. A later kind (a container adopted from an
// earlier delivery) is one more value here and one more branch in the
// engine's acquire.
const (
	// PlacementCold: the engine creates the run's container.
	PlacementCold PlacementKind = "cold"
	// PlacementWarm: the run claimed a warm container (worker/warm),
	// which is handed the run instead; the stages take over what it was
	// made with (Placement.Dir, Placement.Workspace).
	PlacementWarm PlacementKind = "warm"
)

// Placement is where a run's container comes from, acquired by the engine
// once, before the first hook, and read by the stages (never changed).
// The zero Placement is cold.
type Placement struct {
	// Kind is PlacementCold or PlacementWarm; "" reads as cold.
	Kind PlacementKind
	// Dir is the host path of the run directory a warm container mounts,
	// which the run-directory stage takes over instead of staging one;
	// "" for a cold run.
	Dir string
	// Workspace is the workspace a warm container made for workspace runs
	// mounts, which the workspace stage takes over instead of making one;
	// nil for a cold run or a container made for runs without one.
	Workspace *WarmWorkspace
}

// Warm reports whether the run claimed a warm container.
func (p Placement) Warm() bool { return p.Kind == PlacementWarm }

// WarmWorkspace is what a warm container made for workspace runs was
// created with (the workspace stage's Trees.MakeWarm): the delivery
// directory (its snapshot input, gate and scratch subdirectories, empty),
// the empty tmpfs volume of the profile's workspace_mib and the staged
// in-jail tool, mounted as a cold workspace run mounts its own. The run
// that claims the container takes them over (Take): its workspace stage
// then removes them with the run, as its own; until then the pool does.
type WarmWorkspace struct {
	// Dir is the host directory (under the worker's StateDir/ws).
	Dir string
	// Volume is the tmpfs volume's spec.
	Volume jail.VolumeSpec
	// Tool and ToolDigest are the staged jetcrew binary's host path and
	// SHA-256 (hex).
	Tool, ToolDigest string
	// Mounts are the container's workspace mounts.
	Mounts []jail.Mount
	// Alive reports whether what was made with the workspace still runs
	// (its capture container): the pool never hands out a container whose
	// workspace is not alive. Nil: always.
	Alive func() bool
	// Started, the pool's refill (set by the engine's make function), is
	// called once by the run that took the workspace when its agent
	// started (after the in-jail unpack), or when it stopped waiting for
	// that. Nil: nothing.
	Started func()

	taken atomic.Bool
}

// Take marks the workspace as the claiming run's: the pool no longer
// removes it.
func (w *WarmWorkspace) Take() { w.taken.Store(true) }

// Taken reports whether a run took the workspace over (Take).
func (w *WarmWorkspace) Taken() bool { return w.taken.Load() }
