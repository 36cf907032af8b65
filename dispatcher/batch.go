package dispatcher

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nkeys"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/workspace"
)

// Batch is one submit of requests that share a signer and a workspace.
// `jetcrew submit` sends a batch of one; `submit --attempts` one of N.
type Batch struct {
	// Requests are the runs to publish, in order, each made by Encode
	// (and keyed to its group by WithGroupKey).
	Requests []Encoded
	// Key, when not nil, signs every request as SubmitSigned does.
	Key nkeys.KeyPair
	// Workspace, when not empty, is a directory snapshotted and uploaded
	// once (UploadWorkspace, with Snapshot and Buckets): every request's
	// workspace field becomes that snapshot (Encoded.WithWorkspace).
	Workspace string
	Snapshot  workspace.SnapshotOptions
	Buckets   workspace.BucketConfig
	// Uploaded, when not nil, is called once the workspace is stored,
	// before anything is published.
	Uploaded func(workspace.Uploaded)
	// Published, when not nil, is called with each run id once the stream
	// stored its request.
	Published func(id string)
	// NotProvisioned, when not nil, is called when a publish fails with
	// ErrNotProvisioned (jetcrew's streams do not exist yet: a worker
	// starting creates them). It returns nil to publish again, after
	// waiting as long as it chose, or the error to end the batch with.
	// When nil, such a publish ends the batch.
	NotProvisioned func(ctx context.Context, err error) error
}

// FromError is SubmitBatch's error for a run a request would start from.
// A request whose workspace names a run (messages.WorkspaceRef.From)
// needs that run ended with a workspace result; the worker checks again.
type FromError struct {
	// Run is the run the request starts from.
	Run string
	// State is the run's state; empty when it could not be read.
	State messages.State
	// Err is why: Status's error (ErrRunNotFound, ...), or ErrNoResult
	// when the run has not ended or left no workspace result.
	Err error
}

// Error says which run the request would start from, and why it cannot.
func (e *FromError) Error() string {
	if errors.Is(e.Err, ErrNoResult) {
		return fmt.Sprintf("start from run %s: the run is %s and has no workspace result to start from", e.Run, e.State)
	}
	return fmt.Sprintf("start from run %s: %v", e.Run, e.Err)
}

// Unwrap returns Err, so errors.Is sees ErrRunNotFound or ErrNoResult through it.
func (e *FromError) Unwrap() error { return e.Err }

// SubmitBatch checks, uploads and publishes b's requests in order, returning their ids.
//
// It first refuses, publishing nothing, an Encoded that Encode did not
// make (an error wrapping messages.ErrInvalidRequest), and a run a request
// starts from that it cannot read or that has no workspace result (a
// *FromError). It then uploads b.Workspace once, names the snapshot in
// every request (an encoding grown too large wraps
// messages.ErrInvalidRequest, nothing published) and publishes each
// request as SubmitEncoded does, signed with b.Key. A publish that fails
// ends the batch: the ids returned are those published before it, and the
// error is SubmitEncoded's (ErrDuplicateSubmit, ErrIDInUse, ...), or
// b.NotProvisioned's.
func (s *Submitter) SubmitBatch(ctx context.Context, b Batch) ([]string, error) {
	for _, e := range b.Requests {
		if e.data == nil {
			return nil, fmt.Errorf("submit: %w", errNotEncoded)
		}
	}
	if err := s.checkFrom(ctx, b.Requests); err != nil {
		return nil, err
	}
	encs, err := s.withUpload(ctx, b)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range encs {
		id, err := s.publishWhenProvisioned(ctx, e, b)
		if err != nil {
			return ids, err
		}
		ids = append(ids, id)
		if b.Published != nil {
			b.Published(id)
		}
	}
	return ids, nil
}

// checkFrom is the submitter's own check of the runs encs start from: each
// must be readable, ended and with a workspace result; the worker checks
// again.
func (s *Submitter) checkFrom(ctx context.Context, encs []Encoded) error {
	checked := map[string]bool{}
	for _, e := range encs {
		ws := e.req.Workspace
		if ws == nil || ws.From == "" || checked[ws.From] {
			continue
		}
		checked[ws.From] = true
		st, err := s.runs.Status(ctx, ws.From)
		if err != nil {
			return &FromError{Run: ws.From, Err: err}
		}
		if !st.State.Final() || st.WorkspaceResult == nil {
			return &FromError{Run: ws.From, State: st.State, Err: ErrNoResult}
		}
	}
	return nil
}

// withUpload uploads b.Workspace, when given, and returns b's requests
// naming it; b's requests as they are otherwise.
func (s *Submitter) withUpload(ctx context.Context, b Batch) ([]Encoded, error) {
	if b.Workspace == "" {
		return b.Requests, nil
	}
	up, err := s.results.UploadWorkspace(ctx, b.Workspace, b.Snapshot, b.Buckets)
	if err != nil {
		return nil, fmt.Errorf("workspace %s: %w", b.Workspace, err)
	}
	if b.Uploaded != nil {
		b.Uploaded(up)
	}
	encs := make([]Encoded, len(b.Requests))
	for i, e := range b.Requests {
		if encs[i], err = e.WithWorkspace(up.Ref); err != nil {
			return nil, fmt.Errorf("submit: %w", err)
		}
	}
	return encs, nil
}

// publishWhenProvisioned publishes e, signed with b.Key, handing a publish
// refused with ErrNotProvisioned to b.NotProvisioned until it returns an
// error or the publish is no longer refused so.
func (s *Submitter) publishWhenProvisioned(ctx context.Context, e Encoded, b Batch) (string, error) {
	for {
		id, err := s.publish(ctx, e, b.Key)
		if !errors.Is(err, ErrNotProvisioned) || b.NotProvisioned == nil {
			return id, err
		}
		if err := b.NotProvisioned(ctx, err); err != nil {
			return "", err
		}
	}
}
