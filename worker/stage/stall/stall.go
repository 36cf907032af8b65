// Package stall is the stage that stops a run showing no progress (no
// output, no coordination traffic) for its profile's stall_timeout, ending
// it "stalled".
package stall

import (
	"fmt"
	"time"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// For returns the stall watchdog of a run whose profile has a stall
// timeout (StallTimeoutDuration > 0).
func For(run *stage.Run) *Stage {
	return &Stage{after: run.Profile.StallTimeoutDuration(), progress: run.Progress}
}

// Stage is one run's stall watchdog.
type Stage struct {
	after    time.Duration
	progress *stage.Progress
}

// The hooks Stage implements, declared so that a signature drifting from
// the contract fails to build (worker/runner's TestStageHooksImplemented
// holds this list to exactly the hooks implemented).
var (
	_ stage.Checker = (*Stage)(nil)
)

// Name returns "stall".
func (s *Stage) Name() string { return "stall" }

// CheckEvery is a tenth of the stall timeout, between 50ms and 1s.
func (s *Stage) CheckEvery() time.Duration {
	return min(time.Second, max(50*time.Millisecond, s.after/10))
}

// Check stops the run, stalled, once its last progress is older than the
// stall timeout.
func (s *Stage) Check(time.Time) (*stage.Stop, bool) {
	if over := s.progress.Since() - s.after; over > 0 {
		return &stage.Stop{State: messages.StateStalled, Overdue: over,
			Reason: fmt.Sprintf("no progress (no output, no coordination traffic) for %s", s.after)}, false
	}
	return nil, false
}
