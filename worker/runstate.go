package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jetcrew/jetcrew/messages"
)

// loadState returns the recorded state of run id and its revision in the
// bucket.
func (w *Worker) loadState(ctx context.Context, id string) (messages.RunState, uint64, error) {
	var st messages.RunState
	e, err := w.runs.Get(ctx, id)
	if err != nil {
		return st, 0, err
	}
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		return st, 0, fmt.Errorf("decode state of %s: %w", id, err)
	}
	return st, e.Revision(), nil
}

// errFenced is returned by putState when the run's state changed since this
// delivery last wrote it: another delivery claimed the run, or a cancel
// finalised it. The delivery must then stop acting for the run.
var errFenced = errors.New("run state changed under this delivery (lease lost)")

// putState writes r.state only if the stored revision is still the one this
// delivery last wrote (or, for the first write, no state exists), and
// records the new revision.
//
// A try whose reply is lost is tried again; when the retry then conflicts,
// the stored record is read back, and if it is the very record this call
// wrote (the lost reply's write landed), the write counts as done.
func (r *run) putState(ctx context.Context) error {
	r.state.UpdatedAt = time.Now().UTC()
	b, err := json.Marshal(r.state)
	if err != nil {
		return err
	}
	tries := 0
	return retryOp(ctx, func(ctx context.Context) error {
		tries++
		var rev uint64
		var err error
		if r.rev == 0 {
			rev, err = r.w.runs.Create(ctx, r.state.ID, b)
		} else {
			rev, err = r.w.runs.Update(ctx, r.state.ID, b, r.rev)
		}
		if err == nil {
			r.rev = rev
			return nil
		}
		if !isRevisionConflict(err) {
			return err
		}
		if tries > 1 {
			if e, gerr := r.w.runs.Get(ctx, r.state.ID); gerr == nil && bytes.Equal(e.Value(), b) {
				r.rev = e.Revision()
				return nil
			} else if gerr != nil && !isNotFound(gerr) {
				return gerr
			}
		}
		return backoff.Permanent(errFenced)
	})
}
