package dispatcher

import (
	"context"
	"errors"
	"fmt"

	"github.com/jetcrew/jetcrew/messages"
)

// ErrForeignDeadLetter is wrapped by the error Replay returns for a dead
// letter no worker wrote for the run: its body is not the request the run's
// state (written by the worker that ran it) records, the run has no state at
// all, or the body names another run. Anyone who may publish on
// jetcrew.failed.> could have put it there; replaying it would run their
// request under the run's id.
var ErrForeignDeadLetter = errors.New("dead letter not written by a worker for this run")

// verifyDeadLetter checks that dl is a dead letter a worker wrote for run id
// and returns the run's state. A run that succeeded or is not finished is
// refused with an error wrapping ErrReplayRefused. What it checks is what the worker stamps in
// the run's state, which the publisher of a dead letter cannot choose: the
// digest of the request body (RunState.RequestDigest) must be the digest of
// dl's body; for a state written before digests existed, the worker that
// wrote it must be the dead letter's. The body may name no id (the worker
// derived one) or id itself.
func (dls *DeadLetters) verifyDeadLetter(ctx context.Context, id string, dl DeadLetter) (messages.RunState, error) {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("replay run %s: %w: %s", id, ErrForeignDeadLetter, fmt.Sprintf(format, args...))
	}
	if dl.RunID != id {
		return messages.RunState{}, refuse("its subject %s names run %q", dl.Subject, dl.RunID)
	}
	if body := messages.SalvageRunID(dl.Request); body != "" && body != id {
		return messages.RunState{}, refuse("its request names run %q", body)
	}
	st, err := dls.runs.Status(ctx, id)
	if errors.Is(err, ErrRunNotFound) {
		return st, refuse("the run has no state, so no worker ran it")
	}
	if err != nil {
		return st, fmt.Errorf("replay: %w", err)
	}
	switch {
	case st.State == messages.StateSucceeded:
		return st, fmt.Errorf("replay run %s: %w: the run already succeeded (a worker would refuse the request as a duplicate)", id, ErrReplayRefused)
	case !st.State.Final():
		return st, fmt.Errorf("replay run %s: %w: the run is %s (replayed or submitted again, and not finished); wait for it, or cancel it first", id, ErrReplayRefused, st.State)
	case st.RequestDigest != "":
		if got := messages.RequestDigest(dl.Request); got != st.RequestDigest {
			return st, refuse("its body (%s) is not the request the run's state records (%s)", got, st.RequestDigest)
		}
	case dl.Worker == "" || dl.Worker != st.Worker:
		return st, refuse("it names worker %q, the run's state %q", dl.Worker, st.Worker)
	}
	return st, nil
}
