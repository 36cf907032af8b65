package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/workspace"
)

// WorkspaceConfig bounds and stores the workspaces of runs whose request
// names one (see docs/workspaces.md).
type WorkspaceConfig struct {
	// MaxBytes bounds a snapshot's size, the sum of its unpacked files and
	// the new content a run's result may hold, each in bytes. Default
	// workspace.DefaultMaxSnapshotBytes.
	MaxBytes int64
	// MaxFiles bounds the entries of a workspace. Default 200000.
	MaxFiles int
	// Buckets configures the workspace and result buckets when the worker
	// creates them; Replicas defaults to the provisioning's replicas.
	Buckets workspace.BucketConfig
	// CaptureTimeout bounds the capture of one run, from the run's end
	// (the capture container's ready line, the signal, the capture) to the
	// capture container's exit. Default 10 minutes.
	CaptureTimeout time.Duration
	// GitFetches is the most git fetches (fetch, snapshot, store) the
	// worker makes at once, whatever its concurrency. Each holds the
	// fetched objects in the worker's memory: up to MaxBytes inflated,
	// beside the pack as received (also at most MaxBytes) and go-git's
	// buffers, so the worker's memory for git sources grows with
	// GitFetches, not with its concurrency. Runs on one remote and ref
	// resolved at the same time share one resolution. Default 2.
	GitFetches int
}

func (c WorkspaceConfig) withDefaults(replicas int) WorkspaceConfig {
	if c.MaxBytes == 0 {
		c.MaxBytes = workspace.DefaultMaxSnapshotBytes
	}
	if c.MaxFiles == 0 {
		c.MaxFiles = 200000
	}
	if c.CaptureTimeout == 0 {
		c.CaptureTimeout = 10 * time.Minute
	}
	if c.GitFetches == 0 {
		c.GitFetches = 2
	}
	if c.Buckets.Replicas == 0 {
		c.Buckets.Replicas = replicas
	}
	return c
}

// wsStores holds the worker's workspace and result buckets once found, and
// the delivery workspace directories in use.
type wsStores struct {
	mu       sync.Mutex
	ws, res  jetstream.ObjectStore
	resolved bool
	live     map[string]bool // workspace dirs of deliveries in progress
	// inUse counts the deliveries using each cached snapshot (by path) and
	// staged tool ("tool:<digest>").
	inUse map[string]int
}

// setLive marks a delivery's workspace directory in use (or no longer), so
// the reconciler leaves it alone.
func (w *Worker) setLive(dir string, live bool) {
	s := &w.wsStores
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live == nil {
		s.live = map[string]bool{}
	}
	if live {
		s.live[dir] = true
	} else {
		delete(s.live, dir)
	}
}

// isLive reports whether setLive marked key in use.
func (w *Worker) isLive(key string) bool {
	w.wsStores.mu.Lock()
	defer w.wsStores.mu.Unlock()
	return w.wsStores.live[key]
}

// removeStaleWorkspaces removes delivery workspace directories no delivery
// of this worker uses and older than OrphanGrace: left over by a crash.
func (w *Worker) removeStaleWorkspaces() {
	root := filepath.Join(w.cfg.StateDir, "ws")
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		dir := filepath.Join(root, e.Name())
		live := w.isLive(dir)
		info, err := e.Info()
		if err != nil || live || time.Since(info.ModTime()) < w.cfg.OrphanGrace {
			continue
		}
		w.log.Info().Str("dir", dir).Msg("removing a stale workspace directory")
		if err := os.RemoveAll(dir); err != nil {
			w.log.Warn().Err(err).Str("dir", dir).Msg("remove stale workspace directory")
		}
	}
	w.removeStaleSnapshots()
}

// stores returns the workspace and result buckets, creating them on first
// use.
func (w *Worker) stores(ctx context.Context) (jetstream.ObjectStore, jetstream.ObjectStore, error) {
	s := &w.wsStores
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.resolved {
		return s.ws, s.res, nil
	}
	cfg := w.cfg.Workspace.withDefaults(w.cfg.Provision.Replicas)
	ws, res, err := workspace.EnsureBuckets(ctx, w.js, cfg.Buckets)
	if err != nil {
		return nil, nil, err
	}
	s.ws, s.res, s.resolved = ws, res, true
	return ws, res, nil
}

// runWorkspace is one delivery's staged workspace. The worker creates and
// mounts the directories and stages the files; it never writes a file the
// snapshot names nor reads the tree: unpacking and capture run in the jail
// (workspace_jail.go).
type runWorkspace struct {
	// dir holds scratch (the capture container's object store), in (its
	// input: the snapshot's link) and capture.tar, the capture's output
	// stream: host directories of the worker's. The tree itself is the
	// volume.
	dir string
	// volume names the delivery's tmpfs volume, the run's /workspace, of
	// mib MiB (Runtime.CreateVolume), vol its spec.
	volume string
	mib    int64
	vol    VolumeSpec
	// snapshot is the cached snapshot file (snapcache.go), tool the staged
	// jetcrew binary running the in-jail commands, toolDigest its SHA-256
	// (hex).
	snapshot, tool, toolDigest string
	// capture is the spec of the capture container, made from the run's;
	// captureC the container, started (waiting) during staging, its
	// output taken by captureOut and its exit reported on captureExit;
	// captureGone, once its removal started, closes when it is removed.
	capture     ContainerSpec
	captureC    Container
	captureOut  *captureOutput
	captureExit chan captureExit
	stopWait    context.CancelFunc
	captureGone chan struct{}
	// held reports once whether the capture container started (startCapture's
	// error); waitHeld takes it, heldErr keeps it.
	held     chan error
	heldOnce sync.Once
	heldErr  error
}

// waitHeld waits for the capture container's start, once, and returns its
// error: nil when the capture container runs and holds the volume.
func (rw *runWorkspace) waitHeld() error {
	rw.heldOnce.Do(func() {
		if rw.held != nil {
			rw.heldErr = <-rw.held
		}
	})
	return rw.heldErr
}

// gate is the run container's read-only gate directory: the worker writes
// heldFile into it once the capture container holds the volume, and `jetcrew
// workspace exec` waits for that file before it unpacks.
func (rw *runWorkspace) gate() string { return filepath.Join(rw.dir, "gate") }

// heldFile is the name of the file in gate that lets exec go on.
const heldFile = "held"

func (rw *runWorkspace) scratch() string { return filepath.Join(rw.dir, "scratch") }

// in is the capture container's input directory, read-only there: the
// worker links the snapshot into it once downloaded.
func (rw *runWorkspace) in() string { return filepath.Join(rw.dir, "in") }

// workspaceDir returns the host directory of a delivery's workspace:
// StateDir/ws/<run dir name>-<seq>-<attempt>.
func (w *Worker) workspaceDir(runID string, seq uint64, attempt int) string {
	return filepath.Join(w.cfg.StateDir, "ws", fmt.Sprintf("%s-%d-%d", filepath.Base(w.runDir(runID, seq, attempt)), seq, attempt))
}

// stageWorkspace, when the request names a workspace, fetches its snapshot
// (checked: digest, caps, a header scan) into the worker's cache, creates
// the delivery's tmpfs volume of the profile's workspace_mib, owned by the
// profile's user, and begins to start the capture container, which waits
// and holds the volume mounted until the capture (workspace_jail.go); it
// does not wait for that start (holdWorkspace, in start, does). The volume
// is mounted writable at messages.WorkspaceDir, the container's working
// directory, beside the snapshot, the jetcrew binary and the gate
// directory, read-only; the run's command is prefixed with `jetcrew
// workspace exec`, which waits for the gate's held file, then unpacks
// inside the container, as the run's user, before it execs the agent. A
// refused, missing, corrupt or oversized snapshot is an error retrying
// cannot fix (the run fails, with a dead letter, before the run's container
// starts); a store or engine that cannot be reached is a transientError
// (the request is handed back for a retry). What was made is given up by
// dropWorkspace (release).
func (r *run) stageWorkspace(ctx context.Context, spec *ContainerSpec, prof Profile) error {
	ref := r.req.Workspace
	if ref == nil {
		return nil
	}
	if ref.Git != nil {
		resolved, err := r.resolveGitWorkspace(ctx, prof, *ref.Git) // workspace_git.go
		if err != nil {
			return err
		}
		ref = &resolved
	}
	cfg := r.w.cfg.Workspace.withDefaults(r.w.cfg.Provision.Replicas)
	if ref.BucketOrDefault() != messages.BucketWorkspaces {
		return fmt.Errorf("workspace bucket %q refused: this worker reads workspaces from %s only", ref.Bucket, messages.BucketWorkspaces)
	}
	uid, gid, err := parseUser(prof.User)
	if err != nil {
		return err
	}
	rw := &runWorkspace{dir: r.w.workspaceDir(r.req.ID, r.meta.Sequence.Stream, int(r.meta.NumDelivered)),
		volume: spec.Name + "-ws", mib: prof.WorkspaceMiB}
	if rw.tool, rw.toolDigest, err = r.w.tools.stage(r.w.cfg.WorkspaceTool); err != nil {
		return fmt.Errorf("workspace tool: %w", err)
	}
	r.w.setLive(rw.dir, true)
	r.w.setLive(volumeKey(rw.volume), true)
	r.w.useSnapshot("tool:"+rw.toolDigest, true)
	r.ws = rw // dropWorkspace gives up what follows, whatever fails
	start := time.Now()
	if err := makeWorkspaceDirs(rw, uid, gid); err != nil {
		return stageError(err, false)
	}
	// The volume and the capture container that holds it start while the
	// snapshot downloads; the snapshot reaches the capture container
	// through a link in its read-only input directory.
	rw.vol = VolumeSpec{Name: rw.volume, SizeBytes: rw.mib << 20, UID: uid, GID: gid,
		Inodes: 2*int64(cfg.MaxFiles) + 10000, Labels: maps.Clone(spec.Labels)}
	rw.vol.Labels[LabelCreated] = time.Now().UTC().Format(time.RFC3339Nano)
	rw.vol.Labels[LabelRole] = RoleWorkspace
	// The wait is bounded, so a capture container a crashed worker left
	// behind gives the volume back on its own.
	waitMax := runTimeout(r.req, prof, r.w.cfg.DefaultTimeout) + r.w.cfg.StopGrace + cfg.CaptureTimeout + 10*time.Minute
	rw.capture = captureSpec(*spec, rw, cfg, waitMax)
	// The run's container does not wait for the capture container's start
	// (holdWorkspace, in start, does): it waits inside, in `jetcrew
	// workspace exec`, for the gate's file.
	// The volume exists before either container is created: a container
	// created first would make the engine create it (from the mount's
	// spec), and CreateVolume's removal of a leftover would then find it
	// in use.
	if err := r.w.cfg.Runtime.CreateVolume(ctx, rw.vol); err != nil {
		return stageError(fmt.Errorf("create the workspace volume: %w", err), errors.Is(err, ErrPermanent))
	}
	rw.held = make(chan error, 1)
	go func() { rw.held <- r.startCapture(ctx) }() // workspace_jail.go
	path, err := r.w.cachedSnapshot(ctx, *ref, cfg)
	if err != nil {
		return stageError(err, isSnapshotRefused(err)) // release waits for startCapture and removes what it made
	}
	rw.snapshot = path
	if err := os.Link(path, filepath.Join(rw.in(), "snapshot.tar")); err != nil {
		return stageError(err, false)
	}
	r.w.failpoint(FailpointAfterStage)
	jailWorkspace(spec, rw, cfg)
	r.log.Info().Str("workspace", ref.Name).Dur("staged_in", time.Since(start)).Msg("workspace staged")
	return nil
}

// stageError is err as staging reports it: "workspace: …", which fails the
// run, when permanent; else a transientError "stage workspace: …", which
// hands the request back for a retry.
func stageError(err error, permanent bool) error {
	if permanent {
		return fmt.Errorf("workspace: %w", err)
	}
	return transientError{fmt.Errorf("stage workspace: %w", err)}
}

// volumeKey is the key of a delivery's volume in the worker's live set.
func volumeKey(name string) string { return "volume:" + name }

// isSnapshotRefused reports whether err means the snapshot itself is
// unusable, so retrying cannot help.
func isSnapshotRefused(err error) bool {
	return errors.Is(err, workspace.ErrSnapshotMissing) || errors.Is(err, workspace.ErrDigestMismatch) ||
		errors.Is(err, workspace.ErrTooLarge) || errors.Is(err, workspace.ErrBadArchive)
}

// makeWorkspaceDirs makes rw's directory (mode 0700, the worker's), with
// an empty scratch directory owned by uid:gid, mode 0755, and an empty
// input directory (the worker's, mode 0755), after removing a leftover of
// a crashed delivery with the same name.
func makeWorkspaceDirs(rw *runWorkspace, uid, gid int) error {
	if err := os.RemoveAll(rw.dir); err != nil {
		return err
	}
	if err := os.MkdirAll(rw.dir, 0o700); err != nil {
		return err
	}
	for _, d := range []string{rw.scratch(), rw.in(), rw.gate()} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	// Empty, the worker's: the run's user owns scratch from here on. The
	// parent stays 0700 (root's).
	return errors.Join(os.Chown(rw.scratch(), uid, gid), os.Chmod(rw.scratch(), 0o755), os.Chmod(rw.in(), 0o755), os.Chmod(rw.gate(), 0o755))
}

// dropWorkspace removes the capture container (or waits for its removal
// to end), then the delivery's volume and directory, and gives up its
// snapshot and tool. The run's own container is gone by then (release's
// order), so the volume is free. A volume that cannot be removed is left
// to the reconciler. The directory's removal never follows a symlink
// (os.RemoveAll works relative to directory descriptors and unlinks
// symlinks as they are).
func (r *run) dropWorkspace() {
	rw := r.ws
	if rw == nil {
		return
	}
	_ = rw.waitHeld() // startCapture may still be running
	if rw.captureGone != nil {
		<-rw.captureGone // bounded by the removal's own timeout
	} else if rw.captureC != nil {
		r.removeCapture(rw.captureC)
	}
	if rw.stopWait != nil {
		rw.stopWait()
	}
	if rw.captureOut != nil {
		rw.captureOut.close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.w.cfg.Runtime.RemoveVolume(ctx, rw.volume); err != nil {
		r.log.Warn().Err(err).Str("volume", rw.volume).Msg("remove workspace volume; the reconciler will retry")
	}
	if err := os.RemoveAll(rw.dir); err != nil {
		r.log.Warn().Err(err).Msg("remove workspace directory")
	}
	r.w.setLive(rw.dir, false)
	r.w.setLive(volumeKey(rw.volume), false)
	if rw.snapshot != "" {
		r.w.useSnapshot(rw.snapshot, false)
	}
	r.w.useSnapshot("tool:"+rw.toolDigest, false)
}

// captureWorkspace records what the run changed in its workspace, after its
// container exited and before its final state, unless o says the snapshot
// never unpacked: a capture container (workspace_jail.go) computes the
// result, the worker uploads its objects to the result bucket under the run
// id and attempt and records them in r.state.WorkspaceResult. A failure is
// recorded in the result's Error, never lost and never fatal to the run's
// outcome. It returns o's reason, saying so when the workspace's tmpfs is
// full.
func (r *run) captureWorkspace(ctx context.Context, o outcome) string {
	reason := o.Reason
	if r.ws == nil || o.Unpack != "" {
		return reason
	}
	if r.stopFailed {
		// The run's processes may still write: a capture would read a
		// live tree, against the capture's promise.
		r.state.WorkspaceResult = &messages.WorkspaceResult{Error: "not captured: the run's container could not be stopped"}
		return reason
	}
	start := time.Now()
	cfg := r.w.cfg.Workspace.withDefaults(r.w.cfg.Provision.Replicas)
	c, err := r.runCapture(ctx, cfg)
	full := r.ws.captureOut != nil && r.ws.captureOut.workspaceFull()
	if full && reason != "" {
		reason += fmt.Sprintf(" (no space left in the workspace: workspace_mib is %d MiB)", r.ws.mib)
	}
	if err != nil {
		r.log.Warn().Err(err).Msg("capture workspace")
		r.state.WorkspaceResult = &messages.WorkspaceResult{Error: "capture failed: " + err.Error(), WorkspaceFull: full}
		return reason
	}
	res := c.Result
	res.WorkspaceFull = full
	if err := r.uploadResults(ctx, c, &res); err != nil {
		r.log.Warn().Err(err).Msg("upload workspace result")
		res.Error = "upload failed: " + err.Error()
	}
	r.state.WorkspaceResult = &res
	r.w.failpoint(FailpointAfterCapture)
	r.log.Info().Dur("captured_in", time.Since(start)).Int("files_changed", res.FilesChanged).Int("commits", res.Commits).Msg("workspace captured")
	return reason
}

// uploadResults stores c's objects (patch, bundle, artifacts) in the result
// bucket under ResultObjectName and lists them in res.Objects. The names
// depend only on the run id and attempt, so a retried upload replaces.
func (r *run) uploadResults(ctx context.Context, c *workspace.CaptureStream, res *messages.WorkspaceResult) error {
	_, store, err := r.w.stores(ctx)
	if err != nil {
		return err
	}
	attempt := int(r.meta.NumDelivered)
	for _, kind := range []string{messages.ResultPatch, messages.ResultBundle, messages.ResultArtifacts} {
		o, ok := c.Object(kind)
		if !ok {
			continue
		}
		name := messages.ResultObjectName(r.req.ID, r.meta.Sequence.Stream, attempt, kind)
		// Tries of their own, not retryOp's 5s each: an object may be
		// large. Each reads the object afresh from the capture's file.
		err := backoff.Retry(func() error {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			_, err := store.Put(pctx, jetstream.ObjectMeta{Name: name}, io.NewSectionReader(o.Data, 0, o.Size))
			return err
		}, backoff.WithContext(backoff.WithMaxRetries(backoff.NewExponentialBackOff(), 4), ctx))
		if err != nil {
			return fmt.Errorf("store %s: %w", name, err)
		}
		res.Objects = append(res.Objects, messages.ResultObject{Name: name, Size: o.Size, SHA256: o.SHA256})
	}
	return nil
}
