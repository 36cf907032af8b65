package profile

import (
	"errors"
	"fmt"
)

// WarmConfig is the profile facet saying how many warm containers to keep.
//
// The warm pool (worker/warm) reads it to size the profile's pools; no
// run's container depends on it (warm.Irrelevant).
type WarmConfig struct {
	// Warm is how many warm containers of this profile each worker keeps
	// started and waiting for a run (worker/warm): a run that finds one
	// ready starts in milliseconds instead of a container start. Bounded
	// by the worker's --warm-max over all profiles; 0 (default) keeps
	// none. It needs coordination on: a warm container waits in the
	// jetcrew launcher the bridge stage mounts.
	Warm int `toml:"warm" json:"warm,omitempty"`
	// WarmWorkspace is how many warm containers of this profile each
	// worker keeps for runs with a workspace: each made as a workspace
	// run's container is, with its own empty tmpfs volume of
	// workspace_mib at /workspace, the staged in-jail tool and empty
	// snapshot and gate directories; the run's snapshot is linked in and
	// unpacked by its launcher once claimed (docs/workspaces.md). A run
	// with a workspace never takes one of Warm's containers, nor a run
	// without one of these (their jails differ). Bounded with Warm by
	// --warm-max; 0 (default) keeps none. It needs coordination on.
	WarmWorkspace int `toml:"warm_workspace" json:"warm_workspace,omitempty"`
}

// MaxWarm is the most warm containers one profile may ask a worker to keep.
const MaxWarm = 64

// validate checks warm and warm_workspace: each 0 to MaxWarm, and
// coordination on (coordinationOn) when either keeps containers (a warm
// container waits in the launcher).
func (w WarmConfig) validate(coordinationOn bool) error {
	if w.Warm < 0 || w.Warm > MaxWarm {
		return fmt.Errorf("warm %d must be between 0 and %d", w.Warm, MaxWarm)
	}
	if w.WarmWorkspace < 0 || w.WarmWorkspace > MaxWarm {
		return fmt.Errorf("warm_workspace %d must be between 0 and %d", w.WarmWorkspace, MaxWarm)
	}
	if w.Warm+w.WarmWorkspace > 0 && !coordinationOn {
		return errors.New("warm and warm_workspace need coordination on: a warm container waits for its run in the jetcrew launcher, which only a profile with coordination on mounts")
	}
	return nil
}
