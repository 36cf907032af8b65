package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/workspace"
)

// Results uploads workspaces and reads, checks and publishes runs' results.
// It is the Dispatcher's role for the Object Store buckets (UploadWorkspace,
// OpenResult, ResultObject, TestReport) and for a result's publish record
// (RecordPublish, LastPublish). It reads runs' states through RunStates.
type Results struct {
	js   jetstream.JetStream
	runs *RunStates
}

// ErrNoResult is wrapped by ResultObject's error when the run has no
// workspace result, or its result has no object of the asked kind; and
// by SubmitBatch's FromError for a run to start from that has none yet.
var ErrNoResult = errors.New("no workspace result")

// UploadWorkspace snapshots dir and uploads the snapshot to the uploads
// bucket, unless the workspace bucket or the uploads bucket already holds
// its bytes (the buckets created with b when missing): see
// workspace.Submit. The returned Ref is the request's workspace field
// (Encoded.WithWorkspace).
func (res *Results) UploadWorkspace(ctx context.Context, dir string, o workspace.SnapshotOptions, b workspace.BucketConfig) (workspace.Uploaded, error) {
	ws, _, err := workspace.EnsureBuckets(ctx, res.js, b)
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
func (res *Results) ResultObject(ctx context.Context, id, kind string) ([]byte, messages.RunState, error) {
	st, err := res.runs.Status(ctx, id)
	if err != nil {
		return nil, st, err
	}
	rr, err := res.OpenResult(ctx, &st, kind)
	if err != nil {
		return nil, st, err
	}
	defer rr.Close()
	b, err := io.ReadAll(rr)
	if err != nil {
		return nil, st, fmt.Errorf("read %s: %w", rr.Object.Name, err)
	}
	return b, st, nil
}
