package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/jetcrew/jetcrew/messages"
)

// Cancel asks the workers to cancel run id, with an empty request on
// jetcrew.cancel.<run_id> (what `nats req jetcrew.cancel.<run_id> ""` sends),
// and returns the reply of the worker that acted:
//
//   - messages.CancelQueued: the run had not started; it is now recorded
//     cancelled and will be skipped when its request is delivered.
//   - messages.CancelStopping: the run was running; its container is being
//     stopped (SIGTERM, the worker's grace period, then SIGKILL) and the run
//     will end cancelled.
//   - messages.CancelAlreadyFinal: the run had already ended; nothing changed.
//   - messages.CancelError: the cancel could not be carried out. Cancel then
//     returns the reply together with an error wrapping ErrCancelFailed.
//
// A run id no worker has seen is recorded cancelled, so its request is
// skipped if it arrives later. When no worker is subscribed the error wraps
// ErrNoWorker. ctx bounds the wait for the reply; without a deadline Cancel
// waits at most 30 seconds.
func (rs *RunStates) Cancel(ctx context.Context, id string) (messages.CancelReply, error) {
	if err := messages.ValidateToken("run id", id); err != nil {
		return messages.CancelReply{}, fmt.Errorf("cancel: %w", err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultRequestTimeout)
		defer cancel()
	}
	resp, err := rs.js.Conn().RequestWithContext(ctx, messages.SubjectCancel(id), nil)
	if errors.Is(err, nats.ErrNoResponders) {
		return messages.CancelReply{}, fmt.Errorf("cancel run %s: %w", id, ErrNoWorker)
	}
	if err != nil {
		return messages.CancelReply{}, fmt.Errorf("cancel run %s: %w", id, err)
	}
	var r messages.CancelReply
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return messages.CancelReply{}, fmt.Errorf("cancel run %s: decode reply %q: %w", id, resp.Data, err)
	}
	if r.Result == messages.CancelError {
		return r, fmt.Errorf("cancel run %s: %w: %s", id, ErrCancelFailed, r.Message)
	}
	return r, nil
}
