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

// Submitter publishes run requests to JETCREW_RUNS, one or a batch at once.
// It is the Dispatcher's role for submitting: Submit, SubmitSigned,
// SubmitEncoded, and SubmitBatch for requests that share a workspace and
// a signer. It reads runs' states through RunStates (a chosen id already
// in use, a run to start from) and uploads workspaces through Results.
type Submitter struct {
	js      jetstream.JetStream
	runs    *RunStates
	results *Results
}

// entropy makes run ids unguessable and monotonic within a millisecond.
var entropy = &ulid.LockedMonotonicReader{MonotonicReader: ulid.Monotonic(rand.Reader, 0)}

// NewRunID returns a fresh run id: a ULID (26 characters, Crockford base32,
// sortable by creation time) with cryptographically random entropy.
func NewRunID() string {
	return ulid.MustNew(ulid.Now(), entropy).String()
}

// Encoded is a run request ready to publish: completed with its defaults
// and run id, checked and encoded to JSON by Encode. Submit publishes one
// it makes itself; SubmitEncoded publishes one the caller made, so a
// program can refuse a bad request before it even connects. The zero value
// holds no request.
type Encoded struct {
	req  messages.RunRequest
	data []byte
	// chosenID is true when the caller named the run id: only such an id
	// can be in use already (see checkSameRequest).
	chosenID bool
	// groupKey, when set, signs the body as it is published
	// (WithGroupKey).
	groupKey nkeys.KeyPair
}

// Encode applies the request defaults (Version, Pool) to req, assigns a new
// run id (NewRunID) when req.ID is empty, checks it against the rules of
// messages.RunRequest and encodes it to JSON. It is the client's one check
// of a request (a worker checks it again, strictly, when it decodes it):
// Submit and SubmitSigned call it, and SubmitEncoded publishes what it
// returns without checking again. The error wraps
// messages.ErrInvalidRequest when the request breaks a rule or its encoding
// is larger than messages.MaxRequestBytes. It does no I/O.
func Encode(req messages.RunRequest) (Encoded, error) {
	e := Encoded{req: req.WithDefaults(), chosenID: req.ID != ""}
	if e.req.ID == "" {
		e.req.ID = NewRunID()
	}
	if err := e.req.Validate(); err != nil {
		return Encoded{}, err
	}
	return e.encode()
}

// Request returns the completed request: defaults applied, run id assigned.
func (e Encoded) Request() messages.RunRequest { return e.req }

// WithWorkspace returns e with its request's Workspace set to ref: for a
// snapshot uploaded (UploadWorkspace) after the rest of the request was
// encoded. Only what changes is checked: ref (messages.WorkspaceRef.Validate)
// and the size of the new encoding; the error wraps
// messages.ErrInvalidRequest as Encode's does.
func (e Encoded) WithWorkspace(ref messages.WorkspaceRef) (Encoded, error) {
	if e.data == nil {
		return Encoded{}, errNotEncoded
	}
	if err := ref.Validate(); err != nil {
		return Encoded{}, err
	}
	e.req.Workspace = &ref
	return e.encode()
}

// errNotEncoded is the error for an Encoded that Encode did not make.
var errNotEncoded = fmt.Errorf("%w: not made by Encode", messages.ErrInvalidRequest)

// encode sets e.data to the JSON encoding of e.req, which must have passed
// its checks, and refuses an encoding larger than messages.MaxRequestBytes.
func (e Encoded) encode() (Encoded, error) {
	data, err := json.Marshal(e.req)
	if err != nil {
		return Encoded{}, fmt.Errorf("%w: encode: %w", messages.ErrInvalidRequest, err)
	}
	if len(data) > messages.MaxRequestBytes {
		return Encoded{}, fmt.Errorf("%w: encoded request is %d bytes, largest allowed is %d", messages.ErrInvalidRequest, len(data), messages.MaxRequestBytes)
	}
	e.data = data
	return e, nil
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
// request under an id whose state records another request's digest is
// refused before anything is published, with an error wrapping ErrIDInUse
// (the worker refuses it too).
//
// Submitting the same id again is safe: within the stream's duplicate
// window (2 minutes) the server drops the second publish, and Submit
// returns the id with an error wrapping ErrDuplicateSubmit; after it, a
// worker refuses a request whose run already succeeded or is still in
// progress.
//
// When jetcrew's streams do not exist the error wraps ErrNotProvisioned.
func (s *Submitter) Submit(ctx context.Context, req messages.RunRequest) (string, error) {
	e, err := Encode(req)
	if err != nil {
		return "", fmt.Errorf("submit: %w", err)
	}
	return s.publish(ctx, e, nil)
}

// SubmitEncoded is Submit for a request Encode already completed and
// checked, signed with key as SubmitSigned signs unless key is nil. It
// checks nothing again; an Encoded that Encode did not make is refused with
// an error wrapping messages.ErrInvalidRequest.
func (s *Submitter) SubmitEncoded(ctx context.Context, e Encoded, key nkeys.KeyPair) (string, error) {
	if e.data == nil {
		return "", fmt.Errorf("submit: %w", errNotEncoded)
	}
	return s.publish(ctx, e, key)
}

// publish is Submit after Encode, signing the request with key when it is
// not nil.
func (s *Submitter) publish(ctx context.Context, e Encoded, key nkeys.KeyPair) (string, error) {
	req, data := e.req, e.data
	msg := nats.NewMsg(messages.SubjectRuns(req.Pool))
	msg.Data = data
	if key != nil {
		if err := signInto(msg.Header, data, key); err != nil {
			return "", fmt.Errorf("submit run %s: %w", req.ID, err)
		}
	}
	if e.groupKey != nil {
		if err := e.signGroup(msg.Header, data); err != nil {
			return "", fmt.Errorf("submit run %s: %w", req.ID, err)
		}
	}
	if e.chosenID {
		if err := s.checkSameRequest(ctx, req.ID, messages.RequestDigest(data)); err != nil {
			return "", err
		}
	}
	ack, err := s.js.PublishMsg(ctx, msg,
		jetstream.WithMsgID(req.ID),
		jetstream.WithExpectStream(messages.StreamRuns))
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		// Nothing stored it: no stream, or no JetStream at all.
		if _, aerr := s.js.AccountInfo(ctx); errors.Is(classify(aerr), ErrNoJetStream) {
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
func (s *Submitter) checkSameRequest(ctx context.Context, id, digest string) error {
	kv, err := s.runs.runsBucket(ctx)
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
