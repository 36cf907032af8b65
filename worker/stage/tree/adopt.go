package tree

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/live"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/workspace"
)

// Adoption (issue 38, docs/workspaces.md "When a worker stops or dies"):
// the run's tree lives on its volume as long as a container that mounts
// it runs: the run's own, and the capture container, which waits for its
// signal. What lived in the worker's process is the capture container's
// attach stream (its ready line, then the capture), the started socket's
// listener and the snapshot's download; the capture begins only when the
// worker signals it, after the run's container exited. The successor
// therefore starts a capture container of its own on the same volume,
// attached from its start as the first one was, and removes the earlier
// one once its own holds the volume: the capture then runs exactly as the
// first worker's would have.

// Adopt takes the run's workspace over from the worker that started it
// (stage.Adopter): the delivery's directory and volume, found through the
// run container's mounts (the gate and messages.WorkspaceDir), held for
// the run; what Note records (the git or earlier-run source, the session,
// the snapshot's digest) read back from the run's record; a new capture
// container, named after the adoption (takeCapture). A run whose gate was
// never opened (held file) or whose snapshot's download was cut off with
// its worker (neither workspace.SnapshotCheckedFile nor
// workspace.SnapshotRefusedFile in the gate: exec waits for a download no
// one makes) is not adoptable, nor one whose tree may have been lost (no
// container held the volume throughout).
func (s *Stage) Adopt(ctx context.Context, req *stage.AdoptRequest, _ *stage.PrestartResponse) error {
	ref := s.run.Request.Workspace
	if ref == nil {
		return nil
	}
	rw, err := adoptedWorkspace(req)
	if err != nil {
		return err
	}
	if rw.tool, rw.toolDigest, err = s.t.tools.Stage(s.t.toolSrc); err != nil {
		return fmt.Errorf("workspace tool: %w", err)
	}
	rw.mib = req.Run.Profile.WorkspaceMiB
	plan := req.Run.Plan
	rw.sessionDir, rw.sessionNames = plan.SessionDir, workspace.SessionNames{Keep: plan.SessionKeep, Skip: plan.SessionSkip}
	s.own(rw)
	st := req.State
	s.git, s.from, s.session, s.mask = st.WorkspaceGit, st.WorkspaceFrom, st.Session, req.Mask
	switch {
	case s.git != nil:
		s.snapshot = s.git.Digest
	case s.from != nil:
		s.snapshot = s.from.Digest
	default:
		s.snapshot = ref.Digest
	}
	return s.takeCapture(ctx, req, rw)
}

// adoptedWorkspace returns the workspace the run container of req mounts:
// its directory (the gate's parent), which must be a directory of this
// worker's user, and its volume; it checks the gate (Adopt).
func adoptedWorkspace(req *stage.AdoptRequest) (*runWorkspace, error) {
	rw := &runWorkspace{}
	for _, m := range req.Mounts {
		switch {
		case m.Target == JailGatePath && !m.Volume:
			rw.dir = filepath.Dir(m.Source)
		case m.Target == messages.WorkspaceDir && m.Volume:
			rw.volume = m.Source
		}
	}
	if rw.dir == "" || rw.volume == "" {
		return nil, fmt.Errorf("the container mounts no workspace gate at %s or no volume at %s", JailGatePath, messages.WorkspaceDir)
	}
	fi, err := os.Lstat(rw.dir)
	if err != nil {
		return nil, fmt.Errorf("workspace directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("workspace directory %s is not a directory", rw.dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("workspace directory %s belongs to user %d, not this worker's", rw.dir, st.Uid)
	}
	exists := func(name string) bool { _, err := os.Lstat(filepath.Join(rw.gate(), name)); return err == nil }
	switch {
	case !exists(heldFile):
		return nil, errors.New("the workspace's gate was never opened")
	case !exists(workspace.SnapshotCheckedFile) && !exists(workspace.SnapshotRefusedFile):
		return nil, errors.New("the snapshot's download into the run's container was cut off with its worker")
	}
	return rw, nil
}

// takeCapture starts the adopter's capture container: the spec of the
// first (captureSpec of the run's), named <run container>-capture-<n> for
// adoption n, with a scratch directory of its own (the earlier one may
// still be preloading into its own), mounting the volume as it is (never
// created anew: the engine's Start refuses a missing one). It holds the
// volume from its start; then retireCaptures checks that the tree never
// went unmounted and removes the earlier capture containers.
func (s *Stage) takeCapture(ctx context.Context, req *stage.AdoptRequest, rw *runWorkspace) error {
	n := req.State.Adoptions
	rw.scratchName = fmt.Sprintf("scratch-%d", n)
	uid, gid := req.Run.Profile.Owner()
	if err := os.RemoveAll(rw.scratch()); err != nil {
		return err
	}
	if err := os.Mkdir(rw.scratch(), 0o755); err != nil {
		return err
	}
	if err := errors.Join(os.Chown(rw.scratch(), uid, gid), os.Chmod(rw.scratch(), 0o755)); err != nil {
		return err
	}
	waitMax := s.run.Timeout + s.t.stopGrace + s.t.cfg.CaptureTimeout + 10*time.Minute
	rw.capture = captureSpec(*req.Spec, rw, s.t.cfg, waitMax)
	rw.capture.Name = fmt.Sprintf("%s-capture-%d", req.Spec.Name, n)
	rw.capture.Labels[jail.LabelCreated] = time.Now().UTC().Format(time.RFC3339Nano)
	for i := range rw.capture.Mounts {
		if rw.capture.Mounts[i].Volume {
			rw.capture.Mounts[i].VolumeSpec = nil
		}
	}
	s.hold(live.ContainerKey + rw.capture.Name)
	if err := s.t.startCaptureContainer(ctx, rw); err != nil {
		return err
	}
	return s.t.retireCaptures(ctx, s.run, req.Container.ID(), rw)
}

// retireCaptures lists the containers of run's attempt once the adopter's
// capture container holds the volume of rw: the run's own (containerID),
// or an earlier capture container, must still run, so the volume stayed
// mounted throughout and the tree is the run's (a tmpfs volume no running
// container mounts loses its content, and is mounted anew, empty). It then
// removes the earlier capture containers; one that cannot be removed now
// is removed by Release, before the volume.
func (t *Trees) retireCaptures(ctx context.Context, run *stage.Run, containerID string, rw *runWorkspace) error {
	cs, err := t.rt.ListManaged(ctx)
	if err != nil {
		return fmt.Errorf("list the run's containers: %w", err)
	}
	held := false
	for _, c := range cs {
		if c.Labels[jail.LabelInstall] != run.Labels[jail.LabelInstall] || c.Labels[jail.LabelRunID] != run.ID() ||
			c.Labels[jail.LabelAttempt] != run.Labels[jail.LabelAttempt] {
			continue
		}
		switch {
		case c.ID == containerID:
			held = held || c.State == "running"
		case c.Labels[jail.LabelRole] == jail.RoleCapture && c.Name != rw.capture.Name:
			held = held || c.State == "running"
			rw.stale = append(rw.stale, c.ID)
		}
	}
	if !held {
		return errors.New("the workspace's tree is lost: neither the run's container nor a capture container ran when this worker's capture container started")
	}
	var kept []string
	for _, id := range rw.stale {
		if err := t.rt.Remove(ctx, id); err != nil {
			run.Log.Warn().Err(err).Str("container_id", id).Msg("remove the earlier capture container; retried at release")
			kept = append(kept, id)
		}
	}
	rw.stale = kept
	return nil
}

// leave gives up what rw holds in this worker's process,
// for a successor to adopt the run (stage.ReleaseRequest.Leave): the
// started socket's listener, the capture container's attach stream and
// wait (Detach: it runs on, holding the volume). A snapshot still
// streaming in is waited for (the run's container unpacks it), and so are
// the puts of checked snapshots. The volume, the capture container and
// the delivery's directory stay.
func (rw *runWorkspace) leave(log zerolog.Logger) {
	if rw.started != nil {
		_ = rw.started.Close()
	}
	_ = rw.waitHeld()
	if rw.captureC != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rw.captureC.Detach(ctx); err != nil {
			log.Warn().Err(err).Msg("detach from the capture container")
		}
	}
	if rw.stopWait != nil {
		rw.stopWait()
	}
	if rw.captureOut != nil {
		rw.captureOut.close()
	}
}
