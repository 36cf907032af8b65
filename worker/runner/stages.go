package runner

import (
	"context"
	"fmt"

	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/stage/bridge"
	"github.com/jetcrew/jetcrew/worker/stage/rundir"
	"github.com/jetcrew/jetcrew/worker/stage/stall"
	"github.com/jetcrew/jetcrew/worker/warm"
)

// stagesFor builds the list of a run's stages, in the order their hooks
// are called (Release in reverse), from its profile and its request: the
// one place that knows which stages exist. A stage the run does not use is
// not in its list and costs it nothing. A new stage is a new package under
// worker/stage and one line here.
func (e *Runner) stagesFor(run *stage.Run) []stage.Stage {
	if e.testStages != nil {
		return e.testStages(run)
	}
	p, plan, f := run.Profile, run.Plan, &e.cfg.Stages
	coordOn := p.CoordinationOn()
	list := make([]stage.Stage, 0, 7)
	if coordOn || len(plan.Files) > 0 || plan.EgressRelay || plan.EnvFile {
		list = append(list, f.RunDirs.For(run)) // the run's directory, which later stages use
	}
	if plan.EnvFile {
		list = append(list, f.Secrets.For(run)) // the masker, before anything can fail with a secret
	}
	if coordOn || plan.Launch || plan.EgressRelay || plan.EnvFile {
		list = append(list, f.Bridges.For(run)) // the bridge: MCP server, launcher, egress relay
	}
	if run.Request.Workspace != nil {
		list = append(list, f.Trees.For(run))
	}
	if coordOn {
		list = append(list, f.Coord.For(run))
	}
	if p.HasEgress() {
		list = append(list, f.Proxies.For(run))
	}
	if p.StallTimeoutDuration() > 0 {
		list = append(list, stall.For(run))
	}
	return list
}

// MakeWarm makes what one warm container mounts, and its spec
// (warm.Config.Make): the jail a cold container of the profile has
// (ProfileSpec), with the mounts the stages a cold run uses would add,
// made by the same helpers: the run directory (rundir.Mount, staged empty
// but for mcp.json), the bridge (bridge.Mount) and, for a container made
// for workspace runs, the workspace (the workspace stage's
// Trees.MakeWarm), which the claiming run's stages take over
// (stage.Placement). A stage that adds a mount to a cold run adds it here
// too, or every warm container is given back as a mismatch; the golden
// test of placements (TestPlacementJailGolden) fails first.
func (s Stages) MakeWarm(ctx context.Context, req warm.MakeRequest) (made warm.Made, err error) {
	var releases []func(remove bool)
	release := func(remove bool) {
		for _, r := range releases {
			r(remove)
		}
	}
	defer func() {
		if err != nil {
			release(true)
		}
	}()
	dir, releaseDir, err := s.RunDirs.Warm(req.Key)
	if err != nil {
		return made, err
	}
	releases = append(releases, releaseDir)
	bin, digest, err := s.Bridges.Stage()
	if err != nil {
		return made, err
	}
	unholdBin := s.Bridges.Hold(digest)
	releases = append(releases, func(bool) { unholdBin() })
	spec := ProfileSpec(req.Profile)
	spec.Name, spec.Cmd, spec.Env, spec.Labels = req.Spec.Name, req.Spec.Cmd, req.Spec.Env, req.Spec.Labels
	spec.Mounts = []jail.Mount{rundir.Mount(dir, profile.Plan{}).Mount, bridge.Mount(bin, digest).Mount}
	made = warm.Made{Dir: dir}
	if req.Workspace {
		ww, releaseWS, err := s.Trees.MakeWarm(ctx, spec, req.Profile)
		if err != nil {
			return made, fmt.Errorf("workspace: %w", err)
		}
		ww.Started = req.Started
		// The volume and directory are the run's once it took them (its
		// workspace stage removes them with the run).
		releases = append(releases, func(remove bool) { releaseWS(remove && !ww.Taken()) })
		made.Takeover, made.Alive = ww, ww.Alive
		spec.Mounts = append(spec.Mounts, ww.Mounts...)
	}
	made.Spec, made.Release = spec, release
	return made, nil
}
