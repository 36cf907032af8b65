package dispatcher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// ErrResultMismatch is wrapped by a ResultReader's read error when the
// object's bytes are not those the run's state records (size or SHA-256).
var ErrResultMismatch = errors.New("result object does not match the run's record")

// ResultReader streams one result object of a run, checked as it goes:
// a read past the recorded size, or an end whose SHA-256 differs from the
// record, fails with an error wrapping ErrResultMismatch instead of
// io.EOF. What was read before the end is unchecked: a reader that stops
// early (a page showing the first bytes of a large patch) never learns
// whether those bytes were right. Close it.
type ResultReader struct {
	// Object is the object's record in the run's state: its name in
	// messages.BucketResults, size and SHA-256.
	Object messages.ResultObject
	r      jetstream.ObjectResult
	h      hash.Hash
	n      int64
}

// Read reads the object's next bytes.
func (rr *ResultReader) Read(p []byte) (int, error) {
	n, err := rr.r.Read(p)
	rr.h.Write(p[:n])
	rr.n += int64(n)
	if rr.n > rr.Object.Size {
		return n, fmt.Errorf("%w: %s is longer than %d bytes", ErrResultMismatch, rr.Object.Name, rr.Object.Size)
	}
	if errors.Is(err, io.EOF) {
		if sum := hex.EncodeToString(rr.h.Sum(nil)); rr.n != rr.Object.Size || sum != rr.Object.SHA256 {
			return n, fmt.Errorf("%w: %s (size %d, want %d)", ErrResultMismatch, rr.Object.Name, rr.n, rr.Object.Size)
		}
	}
	return n, err
}

// Close releases the object.
func (rr *ResultReader) Close() error { return rr.r.Close() }

// OpenResult opens the result object of the run whose state is st whose
// name ends in "/"+kind (messages.ResultPatch, ResultBundle,
// ResultArtifacts), as st.WorkspaceResult records it. It reads nothing
// until read: the caller bounds what it takes. The error wraps
// ErrNoResult when the run has no such object (no workspace, not ended,
// nothing changed or left, or the object expired).
func (res *Results) OpenResult(ctx context.Context, st *messages.RunState, kind string) (*ResultReader, error) {
	if st.WorkspaceResult == nil {
		return nil, fmt.Errorf("run %s (%s): %w (the request named no workspace, or the run has not ended)", st.ID, st.State, ErrNoResult)
	}
	var obj *messages.ResultObject
	for i, o := range st.WorkspaceResult.Objects {
		if strings.HasSuffix(o.Name, "/"+kind) {
			obj = &st.WorkspaceResult.Objects[i]
		}
	}
	if obj == nil {
		return nil, fmt.Errorf("run %s: %w: no %s (the run changed nothing, or left no artifacts)", st.ID, ErrNoResult, kind)
	}
	obs, err := res.js.ObjectStore(ctx, messages.BucketResults)
	if err != nil {
		return nil, classify(fmt.Errorf("object store %s: %w", messages.BucketResults, err))
	}
	r, err := obs.Get(ctx, obj.Name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("run %s: %w: object %s is gone (expired?)", st.ID, ErrNoResult, obj.Name)
	}
	if err != nil {
		return nil, err
	}
	return &ResultReader{Object: *obj, r: r, h: sha256.New()}, nil
}
