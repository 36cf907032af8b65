package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/internal/origin"
	"github.com/jetcrew/jetcrew/messages"
)

// RunStates reads runs' states, their queued requests and what each was asked.
// It is the Dispatcher's role for "where is run X, and what was it": the
// jetcrew-runs bucket (Status, Runs, WatchRuns), the requests JETCREW_RUNS
// still holds (Requests, Request, RunKnown), the request and prompt a run
// was given (Asked, RecordedPrompt), and Cancel. It is safe for concurrent
// use.
type RunStates struct {
	js jetstream.JetStream

	mu     sync.Mutex
	bucket jetstream.KeyValue // the jetcrew-runs bucket once found
}

// runsBucket returns the jetcrew-runs bucket, looking it up on first use.
func (rs *RunStates) runsBucket(ctx context.Context) (jetstream.KeyValue, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.bucket != nil {
		return rs.bucket, nil
	}
	kv, err := rs.js.KeyValue(ctx, messages.BucketRuns)
	if err != nil {
		return nil, classify(fmt.Errorf("bucket %s: %w", messages.BucketRuns, err))
	}
	rs.bucket = kv
	return kv, nil
}

// Status returns the current state of run id, as the newest record a
// worker wrote in the jetcrew-runs bucket: a record the server relayed into
// the bucket (another stream's RePublish, a source: origin.Relayed) is
// passed over, whatever it says. It returns an error wrapping
// ErrRunNotFound when the bucket has no worker's state for id,
// messages.ErrInvalidToken when id cannot be a run id, and
// ErrNotProvisioned when the bucket does not exist.
func (rs *RunStates) Status(ctx context.Context, id string) (messages.RunState, error) {
	if err := messages.ValidateToken("run id", id); err != nil {
		return messages.RunState{}, fmt.Errorf("status: %w", err)
	}
	m, _, err := origin.Newest(ctx, rs.js.Conn(), runsStream, "$KV."+messages.BucketRuns+"."+id)
	if errors.Is(err, jetstream.ErrMsgNotFound) || (err == nil && m.Header.Get(kvOperation) != "") {
		return messages.RunState{}, fmt.Errorf("run %s: %w", id, ErrRunNotFound)
	}
	if err != nil {
		return messages.RunState{}, fmt.Errorf("status of run %s: %w", id, classify(err))
	}
	return decodeState(id, m.Data)
}

// kvOperation is the header a key-value delete or purge marker carries.
const kvOperation = "KV-Operation"

func decodeState(id string, data []byte) (messages.RunState, error) {
	var st messages.RunState
	if err := json.Unmarshal(data, &st); err != nil {
		return messages.RunState{}, fmt.Errorf("decode state of run %s: %w", id, err)
	}
	return st, nil
}
