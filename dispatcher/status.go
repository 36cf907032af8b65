package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// Status returns the current state of run id, as stored in the jetcrew-runs
// bucket. It returns an error wrapping ErrRunNotFound when the bucket has no
// state for id, messages.ErrInvalidToken when id cannot be a run id, and
// ErrNotProvisioned when the bucket does not exist.
func (d *Dispatcher) Status(ctx context.Context, id string) (messages.RunState, error) {
	if err := messages.ValidateToken("run id", id); err != nil {
		return messages.RunState{}, fmt.Errorf("status: %w", err)
	}
	kv, err := d.runsBucket(ctx)
	if err != nil {
		return messages.RunState{}, fmt.Errorf("status of run %s: %w", id, err)
	}
	e, err := kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return messages.RunState{}, fmt.Errorf("run %s: %w", id, ErrRunNotFound)
	}
	if err != nil {
		return messages.RunState{}, fmt.Errorf("status of run %s: %w", id, classify(err))
	}
	return decodeState(id, e.Value())
}

func decodeState(id string, data []byte) (messages.RunState, error) {
	var st messages.RunState
	if err := json.Unmarshal(data, &st); err != nil {
		return messages.RunState{}, fmt.Errorf("decode state of run %s: %w", id, err)
	}
	return st, nil
}
