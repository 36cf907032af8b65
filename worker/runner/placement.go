package runner

import (
	"context"
	"errors"

	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/warm"
)

// placement is the engine's side of where a run's container comes from
// (stage.Placement): acquired once before the stages are built, started
// once (a warm container's hand-off, else a new container) and released
// once the run holds its container or ends.
type placement struct {
	// st is what the stages read.
	st   stage.Placement
	pool *warm.Pool
	// claimed is the warm container the run claimed, until it is handed
	// the run (then handed) or given back.
	claimed, handed *warm.Container
	log             zerolog.Logger
}

// acquire claims a warm container of prof's pool of the run's kind (with
// a workspace or without) when the profile keeps one: the run's placement
// is then warm, and its stages take over the container's run directory
// and, for a workspace run, its empty workspace. Else the placement is
// cold. A nil pool keeps every run cold.
func acquire(pool *warm.Pool, prof *profile.Profile, workspace bool, log zerolog.Logger) placement {
	pl := placement{st: stage.Placement{Kind: stage.PlacementCold}, pool: pool, log: log}
	if prof.Warm == 0 && prof.WarmWorkspace == 0 {
		return pl
	}
	if pl.claimed = pool.Claim(prof, workspace); pl.claimed != nil {
		ww, _ := pl.claimed.Takeover().(*stage.WarmWorkspace)
		pl.st = stage.Placement{Kind: stage.PlacementWarm, Dir: pl.claimed.Dir(), Workspace: ww}
	}
	return pl
}

// verify gives the claimed warm container back when it cannot take the
// run whose cold container would be spec (warm.Container.Verify): another
// jail than a cold start would create, but for what a hand-off binds
// late, or an image the profile no longer names. The run then starts
// cold (what its stages took over stays theirs).
func (pl *placement) verify(ctx context.Context, spec jail.ContainerSpec) {
	if pl.claimed == nil {
		return
	}
	if err := pl.claimed.Verify(ctx, spec); err != nil {
		pl.log.Warn().Err(err).Msg("warm container cannot take the run; starting cold")
		pl.giveBack(ctx, warm.Reason(err))
	}
}

// errNameWarm wraps the error of recording a warm container's id in the
// run's state, before its hand-off.
type errNameWarm struct{ err error }

func (e errNameWarm) Error() string { return "record the warm container: " + e.err.Error() }
func (e errNameWarm) Unwrap() error { return e.err }

// start starts the run's container spec with its output to output: the
// claimed warm container is handed the run, once name recorded its id in
// the run's state (an error of name is returned as errNameWarm); one lost
// before its hand-off, or whose launcher did not answer its probe, is
// given back and the run starts cold, in a new container (rt.Start), as
// a cold placement does. handed reports whether the warm container took
// the run.
func (pl *placement) start(ctx context.Context, rt jail.Runtime, spec jail.ContainerSpec, output jail.OutputFunc,
	name func(ctx context.Context, id string) error) (c jail.Container, handed bool, err error) {
	if w := pl.claimed; w != nil {
		if err := name(ctx, w.ContainerID()); err != nil {
			return nil, false, errNameWarm{err}
		}
		c, err := w.Handoff(ctx, spec, output)
		if err == nil {
			pl.claimed, pl.handed = nil, w // the run's container now
			return c, true, nil
		}
		pl.log.Warn().Err(err).Msg("warm container lost before its hand-off; starting cold")
		pl.giveBack(ctx, warm.Reason(err))
	}
	c, err = rt.Start(ctx, spec, output)
	return c, false, err
}

// release ends the placement, once the run holds its container (in its
// registry) or ends: a warm container it was handed is the run's (the
// pool lets it go, Handed), one it claimed and was not handed is removed
// (what the run's stages took over stays theirs). Releasing again does
// nothing.
func (pl *placement) release(ctx context.Context) {
	if pl.handed != nil {
		pl.handed.Handed()
		pl.handed = nil
	}
	if pl.claimed != nil {
		pl.claimed.Discard(ctx)
		pl.claimed = nil
	}
}

// giveBack gives the claimed warm container back, unused (counted
// replaced and missed for reason), and removes it.
func (pl *placement) giveBack(ctx context.Context, reason string) {
	pl.pool.GaveBack(pl.claimed, reason)
	pl.release(ctx)
}

// isNameWarm reports whether err is an errNameWarm.
func isNameWarm(err error) bool {
	var e errNameWarm
	return errors.As(err, &e)
}
