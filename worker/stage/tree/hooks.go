package tree

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/workspace"
)

// Prestart stages its snapshot into the run's input directory
// (stageSnapshot: a cached one linked in whole; any other streamed in as
// it downloads, checked — digest, caps, a header scan — beside the run's
// start), creates the delivery's tmpfs volume of the profile's
// workspace_mib, owned by the profile's user (or takes over the empty one
// of the warm container the run claimed, with its capture container:
// makeWorkspace), and begins to start the capture container, which waits
// and holds the volume mounted until the capture (capture.go); it does not
// wait for that start (Poststart does). The volume is mounted writable at
// messages.WorkspaceDir, the container's working directory, beside the
// snapshot's input directory, the jetcrew binary and the gate directory,
// read-only; the run's command is prefixed with `jetcrew workspace exec`,
// which waits for the gate's held file, then unpacks inside the container,
// as the run's user, as the snapshot arrives, and execs the agent once the
// gate says it is whole and checked. A missing, oversized or misrecorded
// snapshot (its records say so) is an error retrying cannot fix (the run
// fails, with a dead letter, before the run's container starts); one whose
// bytes or headers are refused fails it the same way before the agent
// starts (the in-jail exec reports the gate's refusal); a store or engine
// that cannot be reached is transient (the request is handed back for a
// retry). What was made is given up by Release.
func (s *Stage) Prestart(ctx context.Context, req *stage.PrestartRequest, resp *stage.PrestartResponse) error {
	spec, prof := req.Spec, req.Run.Profile
	ref := s.run.Request.Workspace
	if ref == nil {
		return nil
	}
	if ref.Git != nil {
		resolved, err := s.resolveGitWorkspace(ctx, prof, *ref.Git) // git.go
		if err != nil {
			return err
		}
		ref = &resolved
	}
	if ref.From != "" {
		resolved, err := s.resolveFromWorkspace(ctx, prof, ref.From) // from.go
		if err != nil {
			if errors.Is(err, errFromRefused) || isSnapshotRefused(err) {
				return fmt.Errorf("workspace: %w", err)
			}
			return err
		}
		ref = &resolved
	}
	s.snapshot = ref.Digest
	cfg := s.t.cfg
	if ref.BucketOrDefault() != messages.BucketWorkspaces {
		return fmt.Errorf("workspace bucket %q refused: this worker reads workspaces from %s only", ref.Bucket, messages.BucketWorkspaces)
	}
	start := time.Now()
	rw, err := s.makeWorkspace(ctx, spec, prof)
	if err != nil {
		return err
	}
	// The wait is bounded, so a capture container a crashed worker left
	// behind gives the volume back on its own.
	waitMax := s.run.Timeout + s.t.stopGrace + cfg.CaptureTimeout + 10*time.Minute
	rw.held = make(chan error, 1)
	if rw.captureC != nil {
		// A warm container's, started with it (MakeWarm).
		rw.held <- nil
	} else {
		rw.capture = captureSpec(*spec, rw, cfg, waitMax)
		// The run's container does not wait for the capture container's
		// start (holdWorkspace, in start, does): it waits inside, in
		// `jetcrew workspace exec`, for the gate's file.
		go func() { rw.held <- s.startCapture(ctx) }() // capture.go
	}
	if err := s.stageSnapshot(ctx, *ref, rw); err != nil { // snapcache.go
		return err // release waits for startCapture and removes what it made
	}
	s.mask = req.Mask
	if err := s.stageSession(ctx, req, rw, resp); err != nil { // session.go
		return err
	}
	s.run.Failpoint(stage.FailpointAfterStage)
	jailWorkspace(resp, rw, cfg)
	s.run.Log.Info().Str("workspace", ref.Name).Dur("staged_in", time.Since(start)).Msg("workspace staged")
	return nil
}

// stageError is err as staging reports it: "workspace: …", which fails the
// run, when permanent; else a transientError "stage workspace: …", which
// hands the request back for a retry.
func stageError(err error, permanent bool) error {
	if permanent {
		return fmt.Errorf("workspace: %w", err)
	}
	return stage.Transient(fmt.Errorf("stage workspace: %w", err))
}

// isSnapshotRefused reports whether err means the snapshot itself is
// unusable, so retrying cannot help.
func isSnapshotRefused(err error) bool {
	return errors.Is(err, workspace.ErrSnapshotMissing) || errors.Is(err, workspace.ErrDigestMismatch) ||
		errors.Is(err, workspace.ErrTooLarge) || errors.Is(err, workspace.ErrBadArchive)
}

// Release removes the capture container (or waits for its removal
// to end), and any earlier one left by the worker the run was adopted
// from, then the delivery's volume and directory, and gives up its
// snapshot and tool. The run's own container is gone by then (release's
// order), so the volume is free. A volume that cannot be removed is left
// to the reconciler. The directory's removal never follows a symlink
// (os.RemoveAll works relative to directory descriptors and unlinks
// symlinks as they are). A worker leaving the run to a successor
// (req.Leave) keeps the volume, the capture container and the directory,
// and gives up only what lives in its process (runWorkspace.leave).
func (s *Stage) Release(req *stage.ReleaseRequest) {
	defer func() {
		s.waitStored() // it reads the cached snapshot the run holds
		for _, release := range s.releases {
			release()
		}
	}()
	rw := s.rw
	if rw == nil {
		return
	}
	if req.Leave {
		rw.leave(s.run.Log) // adopt.go
		return
	}
	if rw.started != nil {
		_ = rw.started.Close() // awaitStarted gives up now
	}
	s.stopStream()    // it writes into rw's input directory and the cache
	_ = rw.waitHeld() // startCapture may still be running
	if rw.captureGone != nil {
		<-rw.captureGone // bounded by the removal's own timeout
	} else if rw.captureC != nil {
		s.removeCapture(rw.captureC)
	}
	if rw.stopWait != nil {
		rw.stopWait()
	}
	if rw.captureOut != nil {
		rw.captureOut.close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, id := range rw.stale {
		if err := s.t.rt.Remove(ctx, id); err != nil {
			s.run.Log.Warn().Err(err).Str("container_id", id).Msg("remove the earlier capture container; the reconciler will retry")
		}
	}
	if err := s.t.rt.RemoveVolume(ctx, rw.volume); err != nil {
		s.run.Log.Warn().Err(err).Str("volume", rw.volume).Msg("remove workspace volume; the reconciler will retry")
	}
	if err := os.RemoveAll(rw.dir); err != nil {
		s.run.Log.Warn().Err(err).Msg("remove workspace directory")
	}
}

// Exited records what the run changed in its workspace, once its
// container exited and the run ends now (req.Final), before its final
// state, unless the snapshot never unpacked (unpackVerdict, which then
// says so in resp and decides the outcome): the capture
// container (capture.go) computes the result, the worker uploads its
// objects to the result bucket under the run id and attempt, and Note
// records them in the state's WorkspaceResult. A failure is recorded in the
// result's Error, never lost and never fatal to the run's outcome. It says
// in the reason when the workspace's tmpfs was full.
func (s *Stage) Exited(ctx context.Context, req *stage.ExitedRequest, resp *stage.ExitedResponse) {
	// A run whose state is final has its snapshot in the workspace bucket.
	s.waitStored()
	if v, ok := unpackVerdict(req, s.run.Profile.WorkspaceMiB); ok {
		*resp = v
		return
	}
	if !req.Final || s.rw == nil {
		return
	}
	reason := req.Reason
	if req.StopFailed {
		// The run's processes may still write: a capture would read a
		// live tree, against the capture's promise.
		s.result = &messages.WorkspaceResult{Error: "not captured: the run's container could not be stopped"}
		return
	}
	start := time.Now()
	cfg := s.t.cfg
	c, err := s.runCapture(ctx, cfg)
	full := s.rw.captureOut != nil && s.rw.captureOut.workspaceFull()
	if full && reason != "" {
		resp.Reason = reason + fmt.Sprintf(" (no space left in the workspace: workspace_mib is %d MiB)", s.rw.mib)
	}
	if err != nil {
		s.run.Log.Warn().Err(err).Msg("capture workspace")
		s.result = &messages.WorkspaceResult{Error: "capture failed: " + err.Error(), WorkspaceFull: full}
		return
	}
	res := c.Result
	res.WorkspaceFull = full
	if err := s.uploadResults(ctx, c, &res); err != nil {
		s.run.Log.Warn().Err(err).Msg("upload workspace result")
		res.Error = "upload failed: " + err.Error()
	}
	s.result = &res
	s.run.Failpoint(stage.FailpointAfterCapture)
	s.run.Log.Info().Dur("captured_in", time.Since(start)).Int("files_changed", res.FilesChanged).Int("commits", res.Commits).Msg("workspace captured")
}

// Poststart lets the run's container go on once the capture container
// holds the volume (holdWorkspace, capture.go).
func (s *Stage) Poststart(_ context.Context, req *stage.PoststartRequest) error {
	return s.holdWorkspace(req.Cancelled)
}

// Note records the run's git source (in the state and the receipt) and
// the workspace result.
func (s *Stage) Note(st *messages.RunState) {
	if s.git != nil {
		st.WorkspaceGit = s.git
		if st.Receipt != nil {
			st.Receipt.WorkspaceGit = s.git
		}
	}
	if s.from != nil {
		st.WorkspaceFrom = s.from
		if st.Receipt != nil {
			st.Receipt.WorkspaceFrom = s.from
		}
	}
	if s.session != nil {
		st.Session = s.session
		if st.Receipt != nil {
			st.Receipt.Session = s.session
		}
	}
	if s.result != nil {
		if s.result.Snapshot == "" {
			s.result.Snapshot = s.snapshot
		}
		st.WorkspaceResult = s.result
	}
}

// uploadResults stores c's objects (patch, bundle, artifacts) in the result
// bucket under ResultObjectName, all at once, and lists them in
// res.Objects in that order. The names depend only on the run id and
// attempt, so a retried upload replaces.
func (s *Stage) uploadResults(ctx context.Context, c *workspace.CaptureStream, res *messages.WorkspaceResult) error {
	_, store, err := s.t.stores(ctx)
	if err != nil {
		return err
	}
	attempt := s.run.Attempt
	var objects []workspace.CaptureObject
	var names []string
	for _, kind := range []string{messages.ResultPatch, messages.ResultBundle, messages.ResultArtifacts, messages.ResultSession} {
		if o, ok := c.Object(kind); ok {
			if kind == messages.ResultSession {
				if o, err = keptSession(o, s.rw.sessionNames, s.mask); err != nil { // session.go
					res.SessionError = "not kept: " + err.Error()
					continue
				}
			}
			objects = append(objects, o)
			names = append(names, messages.ResultObjectName(s.run.Request.ID, s.run.Seq, attempt, kind))
		}
	}
	errs := make([]error, len(objects))
	var wg sync.WaitGroup
	for i, o := range objects {
		wg.Go(func() {
			// Tries of their own, not runstate.RetryOp's 5s each: an object
			// may be large. Each reads the object afresh from the capture's
			// file (a SectionReader each: safe side by side).
			err := backoff.Retry(func() error {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				defer cancel()
				_, err := store.Put(pctx, jetstream.ObjectMeta{Name: names[i]}, io.NewSectionReader(o.Data, 0, o.Size))
				return err
			}, backoff.WithContext(backoff.WithMaxRetries(backoff.NewExponentialBackOff(), 4), ctx))
			if err != nil {
				errs[i] = fmt.Errorf("store %s: %w", names[i], err)
			}
		})
	}
	wg.Wait()
	for i, o := range objects {
		if errs[i] != nil {
			return errs[i]
		}
		res.Objects = append(res.Objects, messages.ResultObject{Name: names[i], Size: o.Size, SHA256: o.SHA256})
	}
	return nil
}
