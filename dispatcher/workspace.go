package dispatcher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/workspace"
)

// ErrNoResult is wrapped by ResultObject's error when the run has no
// workspace result, or its result has no object of the asked kind.
var ErrNoResult = errors.New("no workspace result")

// UploadWorkspace snapshots dir and uploads the snapshot to the uploads
// bucket, unless the workspace bucket or the uploads bucket already holds
// its bytes (the buckets created with b when missing): see
// workspace.Submit. The returned Ref is the request's workspace field
// (Encoded.WithWorkspace).
func (d *Dispatcher) UploadWorkspace(ctx context.Context, dir string, o workspace.SnapshotOptions, b workspace.BucketConfig) (workspace.Uploaded, error) {
	ws, _, err := workspace.EnsureBuckets(ctx, d.js, b)
	if err != nil {
		return workspace.Uploaded{}, classify(err)
	}
	return workspace.Upload(ctx, ws, dir, o)
}

// ResultObject returns the bytes of the result object of run id whose name
// ends in "/"+kind (messages.ResultPatch, ResultBundle, ResultArtifacts),
// checked against the SHA-256 the run's state records, with the state. It
// returns an error wrapping ErrNoResult when there is no such object, and
// Status's errors.
func (d *Dispatcher) ResultObject(ctx context.Context, id, kind string) ([]byte, messages.RunState, error) {
	st, err := d.Status(ctx, id)
	if err != nil {
		return nil, st, err
	}
	if st.WorkspaceResult == nil {
		return nil, st, fmt.Errorf("run %s (%s): %w (the request named no workspace, or the run has not ended)", id, st.State, ErrNoResult)
	}
	var obj *messages.ResultObject
	for i, o := range st.WorkspaceResult.Objects {
		if strings.HasSuffix(o.Name, "/"+kind) {
			obj = &st.WorkspaceResult.Objects[i]
		}
	}
	if obj == nil {
		return nil, st, fmt.Errorf("run %s: %w: no %s (the run changed nothing, or left no artifacts)", id, ErrNoResult, kind)
	}
	obs, err := d.js.ObjectStore(ctx, messages.BucketResults)
	if err != nil {
		return nil, st, classify(fmt.Errorf("object store %s: %w", messages.BucketResults, err))
	}
	r, err := obs.Get(ctx, obj.Name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, st, fmt.Errorf("run %s: %w: object %s is gone (expired?)", id, ErrNoResult, obj.Name)
	}
	if err != nil {
		return nil, st, err
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, obj.Size+1))
	if err != nil {
		return nil, st, fmt.Errorf("read %s: %w", obj.Name, err)
	}
	sum := sha256.Sum256(b)
	if int64(len(b)) != obj.Size || hex.EncodeToString(sum[:]) != obj.SHA256 {
		return nil, st, fmt.Errorf("result object %s does not match the run's record (size %d, want %d)", obj.Name, len(b), obj.Size)
	}
	return b, st, nil
}
