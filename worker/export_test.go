package worker

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// StoreCAS exposes stateStore.cas to the external tests: it writes st over
// revision rev from state from, through the store the worker uses.
func StoreCAS(ctx context.Context, kv jetstream.KeyValue, js jetstream.JetStream, from messages.State, st messages.RunState, rev uint64) (uint64, error) {
	s := &stateStore{kv: kv, js: js, workerID: "test"}
	return s.cas(ctx, from, &st, rev)
}

// ErrFenced exposes errFenced to the external tests.
var ErrFenced = errFenced
