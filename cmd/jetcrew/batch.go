package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/workspace"
)

// submitRequests is what submit and submit --attempts share once their
// requests are encoded: one dispatcher.SubmitBatch on d that checks
// --from, uploads --workspace once, signs with key and publishes encs in
// order, calling published (when not nil) with each run id. It says the
// upload on stderr unless o.quiet, waits for provisioning as
// o.keepWaiting says (waitProvisioned), and returns the run ids published
// with the error submitError makes of a failed step.
func (a submitCmds) submitRequests(ctx context.Context, d *dispatcher.Dispatcher, o submitOptions, encs []dispatcher.Encoded, key nkeys.KeyPair, published func(string)) ([]string, error) {
	so := workspace.SnapshotOptions{MaxBytes: o.wsMax}
	if dir, err := os.UserCacheDir(); err == nil {
		// HEAD's packed history, reused while HEAD does not move.
		so.CacheDir = filepath.Join(dir, "jetcrew", "snapshots")
	}
	ids, err := d.SubmitBatch(ctx, dispatcher.Batch{
		Requests:  encs,
		Key:       key,
		Workspace: o.workspace,
		Snapshot:  so,
		Buckets:   workspace.BucketConfig{WorkspaceTTL: o.wsTTL},
		Uploaded: func(up workspace.Uploaded) {
			if !o.quiet {
				printUploaded(a.stderr, o.workspace, up)
			}
		},
		Published:      published,
		NotProvisioned: a.waitProvisioned(o.keepWaiting, o.quiet),
	})
	return ids, submitError(err)
}

// submitError gives a failed dispatcher.SubmitBatch the words and the exit
// code of the step that failed: --from's (a usage error when the run has
// no workspace result), a request the workspace field makes too large (a
// usage error), the upload's and the publish's as they are.
func submitError(err error) error {
	var fe *dispatcher.FromError
	switch {
	case errors.As(err, &fe) && errors.Is(fe.Err, dispatcher.ErrNoResult):
		return usageError(fmt.Errorf("--from %s: the run is %s and has no workspace result to start from", fe.Run, fe.State))
	case errors.As(err, &fe):
		return fmt.Errorf("--from %s: %w", fe.Run, fe.Err)
	case errors.Is(err, messages.ErrInvalidRequest):
		return usageError(err)
	}
	return err
}

// printUploaded writes the line about workspace dir's snapshot, uploaded
// (or found stored) as up says, to w.
func printUploaded(w io.Writer, dir string, up workspace.Uploaded) {
	how := fmt.Sprintf("snapshot %s, uploaded in %s", up.SnapshotTook.Round(time.Millisecond), up.UploadTook.Round(time.Millisecond))
	switch {
	case up.Reused:
		how = fmt.Sprintf("snapshot %s, already stored, not uploaded again", up.SnapshotTook.Round(time.Millisecond))
	case up.Streamed:
		how = fmt.Sprintf("snapshot %s, uploaded as it was taken, linked %s later", up.SnapshotTook.Round(time.Millisecond), up.UploadTook.Round(time.Millisecond))
	}
	kind := "a plain directory"
	if up.Info.Git {
		kind = fmt.Sprintf("git, HEAD %s, %d commits", shortID(up.Info.Head), up.Info.Commits)
	}
	fmt.Fprintf(w, "--- workspace %s: %s (%s; %d bytes, %d files; %s)\n", dir, up.Ref.Name, kind, up.Info.Size, up.Info.Files, how)
}

// provisionPoll is how often a submit with --keep-waiting tries again while
// jetcrew's streams and bucket do not exist yet.
var provisionPoll = time.Second

// waitProvisioned is a submit's dispatcher.Batch.NotProvisioned: when
// jetcrew's streams and bucket do not exist yet (a worker starting against
// the server creates them), it says so and, with keepWaiting, has the
// publish tried again every provisionPoll until they do or ctx ends.
func (a submitCmds) waitProvisioned(keepWaiting, quiet bool) func(context.Context, error) error {
	said := false
	return func(ctx context.Context, err error) error {
		if !keepWaiting {
			return fmt.Errorf("%w; if a worker is starting, it may still be provisioning: --keep-waiting waits for it", err)
		}
		if !said && !quiet {
			fmt.Fprintln(a.stderr, "--- jetcrew's streams and bucket do not exist yet on this server (a worker creates them when it starts, waiting for its cluster if need be); waiting")
			said = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(provisionPoll):
			return nil
		}
	}
}
