package dispatcher

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
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
// request is refused before anything is published, with an error wrapping
// messages.ErrInvalidRequest), then publishes it to jetcrew.runs.<pool> with
// the run id as Nats-Msg-Id and waits for the stream's acknowledgement.
//
// Submit writes nothing else: the run's state appears in the jetcrew-runs
// bucket when a worker takes the request (until then Status returns
// ErrRunNotFound), so a submitter needs no write access to run states (see
// docs/security.md).
//
// When the caller chose the id, Submit first reads that run's state: a
// different request under an id whose state records another request's
// digest is refused before anything is published, with an error wrapping
// ErrIDInUse (the worker refuses it too). Within the stream's duplicate
// window (2 minutes) the server drops a second publish of the same id, and
// Submit returns the id with an error wrapping ErrDuplicateSubmit.
//
// Submitting the same id again is safe: within the stream's duplicate window
// (2 minutes) the server drops the second publish; after it, a worker refuses
// a request whose run already succeeded or is still in progress.
//
// When jetcrew's streams do not exist the error wraps ErrNotProvisioned.
func (d *Dispatcher) Submit(ctx context.Context, req messages.RunRequest) (string, error) {
	return d.submit(ctx, req, nil)
}

// submit is Submit, signing the request with key when it is not nil.
func (d *Dispatcher) submit(ctx context.Context, req messages.RunRequest, key nkeys.KeyPair) (string, error) {
	// A generated id is new: only an id the caller chose can be in use.
	chosenID := req.ID != ""
	req, data, err := Encode(req)
	if err != nil {
		return "", fmt.Errorf("submit: %w", err)
	}
	msg := nats.NewMsg(messages.SubjectRuns(req.Pool))
	msg.Data = data
	if key != nil {
		if err := signInto(msg.Header, data, key); err != nil {
			return "", fmt.Errorf("submit run %s: %w", req.ID, err)
		}
	}
	if chosenID {
		if err := d.checkSameRequest(ctx, req.ID, messages.RequestDigest(data)); err != nil {
			return "", err
		}
	}
	ack, err := d.js.PublishMsg(ctx, msg,
		jetstream.WithMsgID(req.ID),
		jetstream.WithExpectStream(messages.StreamRuns))
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		// Nothing stored it: no stream, or no JetStream at all.
		if _, aerr := d.js.AccountInfo(ctx); errors.Is(classify(aerr), ErrNoJetStream) {
			err = aerr
		}
	}
	if err != nil {
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
func (d *Dispatcher) checkSameRequest(ctx context.Context, id, digest string) error {
	kv, err := d.runsBucket(ctx)
	if err != nil {
		return fmt.Errorf("submit run %s: %w", id, err)
	}
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
