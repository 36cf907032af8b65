// Package dispatcher is the client side of jetcrew: it submits run requests
// to the JETCREW_RUNS stream, reads run states from the jetcrew-runs bucket,
// follows a run's events on JETCREW_EVENTS, cancels runs, lists and replays
// dead letters, and uploads workspace snapshots and reads their results.
//
// It speaks only the public wire contract of package messages (see
// docs/wire.md), so anything it does a client in another language can do
// too. Workers provision jetcrew's streams, buckets and consumers, and a
// Dispatcher used before any worker ran returns ErrNotProvisioned. It
// creates only the ephemeral ordered consumers Watch, WatchReplay and
// FollowMessages read with, and, when UploadWorkspace finds them missing,
// the workspace and result buckets.
//
// A Dispatcher, and each of its roles, is safe for concurrent use.
package dispatcher

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// defaultFinishedGrace is how long Watch waits, once the run's state is
// final, for the finished event before it makes one from the state.
const defaultFinishedGrace = 3 * time.Second

// Dispatcher submits and follows runs over one NATS connection, one role per field.
// Create it with New.
//
// Each role is a type of its own, in its own files, that a caller can take
// alone, as nats.go's jetstream hands out a Publisher or a KeyValueManager:
// RunStates (runs and their state, queued requests, what a run was asked),
// Events (watching a run, following events), Submitter (publishing run
// requests), DeadLetters (failed runs and their replay), Budgets (grants),
// Coordination (questions, steering, messages to a group), EgressAsks (the
// egress proxy's questions), Results (workspaces uploaded, results read and
// published) and Fleet (pools, workers, the streams' nodes). The Dispatcher
// embeds them all, so every method of every role is one of its methods
// too, and a caller that needs one role takes that field (d.Events,
// d.DeadLetters). Each role is safe for concurrent use.
type Dispatcher struct {
	*RunStates
	*Events
	*Submitter
	*DeadLetters
	*Budgets
	*Coordination
	*EgressAsks
	*Results
	*Fleet

	js jetstream.JetStream
}

// New returns a Dispatcher using nc, which the caller keeps owning (and
// closes after the Dispatcher's last use). It does no I/O: a server without
// JetStream or without jetcrew's resources shows up as an error from the
// first call that needs them.
func New(nc *nats.Conn) (*Dispatcher, error) {
	if nc == nil {
		return nil, errors.New("dispatcher: nil NATS connection")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	runs := &RunStates{js: js}
	events := &Events{js: js, runs: runs, finishedGrace: defaultFinishedGrace}
	results := &Results{js: js, runs: runs}
	return &Dispatcher{
		RunStates:    runs,
		Events:       events,
		Submitter:    &Submitter{js: js, runs: runs, results: results},
		DeadLetters:  &DeadLetters{js: js, runs: runs, events: events},
		Budgets:      &Budgets{js: js, runs: runs},
		Coordination: &Coordination{js: js, runs: runs},
		EgressAsks:   &EgressAsks{js: js},
		Results:      results,
		Fleet:        &Fleet{js: js},
		js:           js,
	}, nil
}

// Conn returns the NATS connection d uses, the one New was given: for a
// caller that also follows what the server reports on it asynchronously
// (nats.Conn.SetErrorHandler), such as a permissions violation.
func (d *Dispatcher) Conn() *nats.Conn { return d.js.Conn() }

// jsErrStoreFailed is the JetStream error code of a publish the stream
// would not store; its description says which limit refused it
// ("maximum messages per subject exceeded", "maximum bytes exceeded").
const jsErrStoreFailed jetstream.ErrorCode = 10077

// classify wraps err with ErrNotProvisioned or ErrNoJetStream when it says
// a jetcrew resource or JetStream itself is missing, with ErrQueueFull when
// a stream's limit refused a publish, and returns it unchanged otherwise.
func classify(err error) error {
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrStoreFailed && strings.HasPrefix(apiErr.Description, "maximum "):
		return fmt.Errorf("%w: %w", ErrQueueFull, err)
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount),
		// Nobody answers the JetStream API: JetStream is off. (A publish
		// nobody stores fails with ErrNoStreamResponse instead.)
		errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("%w: %w", ErrNoJetStream, err)
	case errors.Is(err, jetstream.ErrBucketNotFound),
		errors.Is(err, jetstream.ErrStreamNotFound),
		errors.Is(err, jetstream.ErrNoStreamResponse):
		return fmt.Errorf("%w: %w", ErrNotProvisioned, err)
	}
	return err
}
