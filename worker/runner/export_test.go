package runner

import "github.com/jetcrew/jetcrew/worker/stage"

// SetStages makes e build every run's stage list with f instead of from
// its profile and its stages' factories (stagesFor): the engine's tests
// drive it with stub stages.
func SetStages(e *Runner, f func(*stage.Run) []stage.Stage) { e.testStages = f }
