package dispatcher

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/jetcrew/jetcrew/messages"
)

// entropy makes run ids unguessable and monotonic within a millisecond.
var entropy = &ulid.LockedMonotonicReader{MonotonicReader: ulid.Monotonic(rand.Reader, 0)}

// NewRunID returns a fresh run id: a ULID (26 characters, Crockford base32,
// sortable by creation time) with cryptographically random entropy.
func NewRunID() string {
	return ulid.MustNew(ulid.Now(), entropy).String()
}

// Encode applies the request defaults (Version, Pool) to req, assigns a new
// run id (NewRunID) when req.ID is empty, validates it and encodes it to
// JSON. It returns the completed request and its encoding, or an error
// wrapping messages.ErrInvalidRequest when the request breaks a rule or its
// encoding is larger than messages.MaxRequestBytes. It does no I/O; Submit
// calls it first.
func Encode(req messages.RunRequest) (messages.RunRequest, []byte, error) {
	req = req.WithDefaults()
	if req.ID == "" {
		req.ID = NewRunID()
	}
	if err := req.Validate(); err != nil {
		return req, nil, err
	}
	data, err := json.Marshal(req)
	if err != nil {
		return req, nil, fmt.Errorf("%w: encode: %w", messages.ErrInvalidRequest, err)
	}
	if len(data) > messages.MaxRequestBytes {
		return req, nil, fmt.Errorf("%w: encoded request is %d bytes, largest allowed is %d", messages.ErrInvalidRequest, len(data), messages.MaxRequestBytes)
	}
	return req, data, nil
}

// Submit publishes a run request and returns its run id.
//
// It completes and checks the request with Encode (an invalid or oversized
// request is refused before anything is written, with an error wrapping
// messages.ErrInvalidRequest), records the run's initial state (queued) in
// the jetcrew-runs bucket, then publishes the request to
// jetcrew.runs.<pool> with the run id as Nats-Msg-Id and waits for the
// stream's acknowledgement.
//
// Submitting the same id again is safe: the existing state is left as it is,
// and within the stream's duplicate window (2 minutes) the server drops the
// second publish, and Submit returns the id with an error wrapping
// ErrDuplicateSubmit; after it, a worker acks a request whose run is already
// final without running it again. A different request under an id whose
// state records another request's digest is refused before anything is
// published, with an error wrapping ErrIDInUse.
//
// When jetcrew's streams or bucket do not exist the error wraps
// ErrNotProvisioned. When the publish fails after the queued state was
// written, that state is removed again (unless a worker has updated it).
func (d *Dispatcher) Submit(ctx context.Context, req messages.RunRequest) (string, error) {
	req, data, err := Encode(req)
	if err != nil {
		return "", fmt.Errorf("submit: %w", err)
	}
	kv, err := d.runsBucket(ctx)
	if err != nil {
		return "", fmt.Errorf("submit run %s: %w", req.ID, err)
	}
	now := time.Now().UTC()
	st := messages.RunState{
		Version:   messages.StateVersion,
		ID:        req.ID,
		State:     messages.StateQueued,
		Profile:   req.Profile,
		Pool:      req.Pool,
		Group:     req.GroupOrID(),
		Labels:    req.Labels,
		QueuedAt:  now,
		UpdatedAt: now,

		RequestDigest: messages.RequestDigest(data),
	}
	stData, err := json.Marshal(st)
	if err != nil {
		return "", fmt.Errorf("submit run %s: encode state: %w", req.ID, err)
	}
	// Create, not Put: a duplicate submit must not reset the state of a run
	// a worker already moved on.
	rev, err := kv.Create(ctx, req.ID, stData)
	created := err == nil
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return "", fmt.Errorf("submit run %s: record queued state: %w", req.ID, classify(err))
	}
	if !created {
		if err := d.checkSameRequest(ctx, kv, req.ID, st.RequestDigest); err != nil {
			return "", err
		}
	}

	ack, err := d.js.Publish(ctx, messages.SubjectRuns(req.Pool), data,
		jetstream.WithMsgID(req.ID),
		jetstream.WithExpectStream(messages.StreamRuns))
	if err != nil {
		if created {
			// Best effort: do not leave a queued state behind for a request
			// that is not on the stream. LastRevision keeps a worker's
			// update, should the publish have landed after all.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = kv.Delete(dctx, req.ID, jetstream.LastRevision(rev))
			cancel()
		}
		return "", fmt.Errorf("submit run %s: publish to %s: %w", req.ID, messages.SubjectRuns(req.Pool), classify(err))
	}
	if ack.Duplicate {
		return req.ID, fmt.Errorf("submit run %s: %w (stream sequence %d holds the first); to run it again after it failed use `jetcrew replay %s`, else submit with a new id",
			req.ID, ErrDuplicateSubmit, ack.Sequence, req.ID)
	}
	return req.ID, nil
}

// checkSameRequest refuses, with an error wrapping ErrIDInUse, to submit a
// request whose digest differs from the one recorded in run id's state. A
// state without a digest (written before digests existed) is not compared.
func (d *Dispatcher) checkSameRequest(ctx context.Context, kv jetstream.KeyValue, id, digest string) error {
	e, err := kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("submit run %s: read its state: %w", id, classify(err))
	}
	var prev messages.RunState
	if err := json.Unmarshal(e.Value(), &prev); err != nil {
		return fmt.Errorf("submit run %s: decode its state: %w", id, err)
	}
	if prev.RequestDigest != "" && prev.RequestDigest != digest {
		return fmt.Errorf("submit run %s: %w (it is %s): nothing was published; choose a new id, or `jetcrew replay %s` to run the recorded request again",
			id, ErrIDInUse, prev.State, id)
	}
	return nil
}
