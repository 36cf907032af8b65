package runner

import (
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/stage/stall"
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
