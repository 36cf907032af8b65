// Package tree is the stage that gives a run whose request names a
// workspace its working tree: the snapshot (uploaded by the submitter, or
// made by the worker from an allowed git remote) is fetched into the
// worker's cache, unpacked inside the jail onto a tmpfs volume of the
// profile's workspace_mib mounted at /workspace, and what the run changed
// is captured, inside the jail too, into the result bucket
// (docs/workspaces.md).
package tree

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/singleflight"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/live"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/stage/internal/staged"
	"github.com/jetcrew/jetcrew/workspace"
)

// Config bounds and stores the workspaces of runs whose request
// names one (see docs/workspaces.md).
type Config struct {
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
	// GitFetches is the most git fetches (fetch, snapshot, store) and
	// builds of a snapshot from an earlier run's result (buildFrom) the
	// worker makes at once, together, whatever its concurrency. Each holds the
	// fetched objects in the worker's memory: up to MaxBytes inflated,
	// beside the pack as received (also at most MaxBytes) and go-git's
	// buffers, so the worker's memory for git sources grows with
	// GitFetches, not with its concurrency. Runs on one remote and ref
	// resolved at the same time share one resolution. Default
	// DefaultGitFetches.
	GitFetches int
}

// DefaultGitFetches is Config.GitFetches' default: 2 fetches at once.
const DefaultGitFetches = 2

// WithDefaults returns a copy of c with every zero field set to its
// default; replicas is the default of Buckets.Replicas.
func (c Config) WithDefaults(replicas int) Config {
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
		c.GitFetches = DefaultGitFetches
	}
	if c.Buckets.Replicas == 0 {
		c.Buckets.Replicas = replicas
	}
	return c
}

// Holds keys of what the workspaces of live runs hold.
const (
	holdDir      = "ws-dir:"   // a delivery's directory under StateDir/ws
	holdSnapshot = "snapshot:" // a cached snapshot file
	holdTool     = "tool:"     // a staged workspace tool, by digest
	holdGitFile  = "git-file:" // a git fetch's snapshot file in StateDir/ws
)

// holdVolume prefixes a delivery's volume: the reconciler asks for it.
const holdVolume = live.VolumeKey

// Deps is what a worker's Trees use.
type Deps struct {
	// Config bounds and stores the workspaces, defaults applied.
	Config Config
	// Runtime creates the volumes and the capture containers.
	Runtime jail.Runtime
	// JS reaches the workspace and result buckets.
	JS jetstream.JetStream
	// StateDir is the worker's state directory: deliveries' directories
	// go under StateDir/ws, cached snapshots under StateDir/snap, staged
	// tools under StateDir/tool.
	StateDir string
	// Tool is the host path of the static jetcrew binary whose `workspace
	// exec` and `workspace capture` commands run inside the jail.
	Tool string
	// StopGrace is the time between SIGTERM and SIGKILL when a run is
	// stopped (part of a capture container's bounded wait).
	StopGrace time.Duration
	// Holds is the worker's registry of what live runs hold.
	Holds *stage.Holds
	// Log receives the stage's logs.
	Log zerolog.Logger
	// RunState reads the recorded state of a run (the one a worker
	// wrote), for a request whose workspace names an earlier run; a run
	// without one is an error wrapping ErrRunNotFound. Nil: such requests
	// fail.
	RunState func(ctx context.Context, id string) (messages.RunState, error)
	// Profiles are the worker's profiles, resolved, as a reload stores
	// them: an earlier run's profile's feeds is read there.
	Profiles *profile.Set
}

// Trees stages one worker's workspaces. Create it with New. Safe for
// concurrent use.
type Trees struct {
	cfg       Config
	rt        jail.Runtime
	js        jetstream.JetStream
	stateDir  string
	toolSrc   string
	stopGrace time.Duration
	holds     *stage.Holds
	log       zerolog.Logger
	tools     *staged.Stager
	git       *gitFlight // shares and bounds git resolutions (git.go)
	from      singleflight.Group
	runState  func(ctx context.Context, id string) (messages.RunState, error)
	profiles  *profile.Set

	// cancel ends the git resolutions' context (Stop).
	cancel context.CancelFunc

	// verified maps a cached snapshot (its digest's hex) to the commit it
	// was found to hold (verifyGitSnapshot).
	verifiedMu sync.Mutex
	verified   map[string]string

	// broken holds the digests whose streamed download broke off
	// (careful).
	broken sync.Map
	// warm holds the workspaces MakeWarm made, by directory, until a run
	// takes one over (takeWarm) or the pool releases it.
	warmMu sync.Mutex
	warm   map[string]*runWorkspace

	mu       sync.Mutex
	ws       *workspace.SnapshotStore
	res      jetstream.ObjectStore
	resolved bool
}

// New returns the Trees configured by d. It does no I/O.
func New(d Deps) *Trees {
	t := &Trees{cfg: d.Config, rt: d.Runtime, js: d.JS, stateDir: d.StateDir, toolSrc: d.Tool, stopGrace: d.StopGrace,
		holds: d.Holds, log: d.Log, runState: d.RunState, profiles: d.Profiles,
		tools: staged.New(filepath.Join(d.StateDir, "tool"), "workspace tool (the jetcrew binary of WorkspaceTool)"),
		git:   newGitFlight(d.Config.GitFetches), verified: map[string]string{}, warm: map[string]*runWorkspace{}}
	return t
}

// Start starts the context git resolutions run under, until Stop. Of
// ctx its values are kept, not its end. It returns nil.
func (t *Trees) Start(ctx context.Context) error {
	ctx, t.cancel = context.WithCancel(context.WithoutCancel(ctx))
	t.git.start(ctx)
	return nil
}

// Stop ends the git resolutions' context and waits for those running.
// It refuses new ones and returns nil; the worker calls it before
// StateDir/ws, which holds a fetch's snapshot file, goes.
func (t *Trees) Stop(context.Context) error {
	if t.cancel != nil {
		t.cancel()
	}
	t.git.stop()
	return nil
}

// Drain removes the staged tools and the directories of the workspace
// machinery when they are empty (the worker stops).
func (t *Trees) Drain() {
	_ = t.tools.GC(nil)
	_ = os.Remove(t.tools.Dir())
	_ = os.Remove(filepath.Join(t.stateDir, "ws"))
}

// Sweep removes what no live run holds and is older than grace, left over
// by a crash: delivery directories under StateDir/ws (a git fetch's file
// included), cached snapshots whose last use is that old, and staged tools.
func (t *Trees) Sweep(grace time.Duration) {
	root := filepath.Join(t.stateDir, "ws")
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		dir := filepath.Join(root, e.Name())
		info, err := e.Info()
		if err != nil || t.holds.Held(holdDir+dir) || t.holds.Held(holdGitFile+dir) || time.Since(info.ModTime()) < grace {
			continue
		}
		t.log.Info().Str("dir", dir).Msg("removing a stale workspace directory")
		if err := os.RemoveAll(dir); err != nil {
			t.log.Warn().Err(err).Str("dir", dir).Msg("remove stale workspace directory")
		}
	}
	t.removeStaleSnapshots(grace)
}

// VolumeHeld reports whether a live run holds the volume name (the
// reconciler spares it).
func (t *Trees) VolumeHeld(name string) bool { return t.holds.Held(holdVolume + name) }

// EnsureBuckets returns the workspace and result buckets, creating them on
// first use; the worker calls it at start, so they exist before any client
// needs them (a submitter may not create streams).
func (t *Trees) EnsureBuckets(ctx context.Context) (ws *workspace.SnapshotStore, res jetstream.ObjectStore, err error) {
	return t.stores(ctx)
}

// stores returns the workspace and result buckets, creating them on first
// use.
func (t *Trees) stores(ctx context.Context) (*workspace.SnapshotStore, jetstream.ObjectStore, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.resolved {
		return t.ws, t.res, nil
	}
	ws, res, err := workspace.EnsureBuckets(ctx, t.js, t.cfg.Buckets)
	if err != nil {
		return nil, nil, err
	}
	t.ws, t.res, t.resolved = ws, res, true
	return ws, res, nil
}

// For returns the stage of one run whose request names a workspace.
func (t *Trees) For(run *stage.Run) *Stage { return &Stage{t: t, run: run} }

// Stage is one run's workspace.
type Stage struct {
	t   *Trees
	run *stage.Run
	rw  *runWorkspace
	// git is the run's git source, resolved, gitCache the name of its
	// commit's cache object; result what the capture recorded.
	git      *messages.GitSource
	gitCache string
	result   *messages.WorkspaceResult
	// from is the run's earlier run, resolved (from.go); snapshot the
	// digest of the snapshot staged, recorded in the result.
	from     *messages.FromSource
	snapshot string
	// fromState is the earlier run's state (from.go); session what the run
	// did with the agent CLI's session, mask the run's secret mask
	// (session.go).
	fromState *messages.RunState
	session   *messages.SessionNote
	mask      stage.Masker
	// releases gives up what the run holds in Holds.
	releases []func()
	// stores are the puts of checked snapshots into the workspace bucket
	// still to do (storeChecked), begun once the agent started
	// (begun, agentStarted); stored closes as each ends. mu guards them.
	mu             sync.Mutex
	stores         []func()
	stored         []chan struct{}
	begun          bool
	agentStartOnce sync.Once
	// streamCancel stops the snapshot's download into the run's input
	// directory (streamSnapshot), streamDone closes once it ended.
	streamCancel context.CancelFunc
	streamDone   chan struct{}
}

// The hooks Stage implements, declared so that a signature drifting from
// the contract fails to build (worker/runner's TestStageHooksImplemented
// holds this list to exactly the hooks implemented).
var (
	_ stage.Prestarter     = (*Stage)(nil)
	_ stage.Poststarter    = (*Stage)(nil)
	_ stage.AnswerObserver = (*Stage)(nil)
	_ stage.Exiter         = (*Stage)(nil)
	_ stage.Noter          = (*Stage)(nil)
	_ stage.Releaser       = (*Stage)(nil)
)

// Name returns "workspace".
func (s *Stage) Name() string { return "workspace" }

// hold holds key for the run until Release.
func (s *Stage) hold(key string) { s.releases = append(s.releases, s.run.Holds.Hold(key)) }

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
	vol    jail.VolumeSpec
	// snapshot is the cached snapshot file (snapcache.go), tool the staged
	// jetcrew binary running the in-jail commands, toolDigest its SHA-256
	// (hex).
	snapshot, tool, toolDigest string
	// sessionDir is the agent CLI's session directory in the container
	// (profile.Plan.SessionDir), kept by exec; sessionIn the host file
	// of the earlier session a follow-up restores, sessionSum its SHA-256
	// (hex), sessionNames which of its entries are kept (session.go).
	sessionDir, sessionIn, sessionSum string
	sessionNames                      workspace.SessionNames
	// capture is the spec of the capture container, made from the run's;
	// captureC the container, started (waiting) during staging, its
	// output taken by captureOut and its exit reported on captureExit;
	// captureGone, once its removal started, closes when it is removed.
	capture     jail.ContainerSpec
	captureC    jail.Container
	captureOut  *captureOutput
	captureExit chan captureExit
	stopWait    context.CancelFunc
	captureGone chan struct{}
	// captureDead is set once the capture container exited (before
	// captureExit receives how).
	captureDead atomic.Bool
	// started listens on the gate's workspace.StartedSocket, to which
	// `jetcrew workspace exec` connects once the tree is unpacked
	// (awaitStarted).
	started *net.UnixListener
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
// StateDir/ws/<run key>-<seq>-<attempt>.
func (t *Trees) workspaceDir(run *stage.Run) string {
	return filepath.Join(t.stateDir, "ws", fmt.Sprintf("%s-%d-%d", run.Key(), run.Seq, run.Attempt))
}

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

// makeWorkspace returns the delivery's workspace, held for the run until
// Release: the one of the warm container the run claimed, taken over
// (stage.Placement.Workspace), or a new one (newWorkspace). The volume and
// the capture container that will hold it start while the snapshot
// downloads; the snapshot reaches both containers through a link in the
// read-only input directory.
func (s *Stage) makeWorkspace(ctx context.Context, spec *jail.ContainerSpec, prof *profile.Profile) (*runWorkspace, error) {
	if ww := s.run.Placement.Workspace; ww != nil {
		ww.Take()
		rw := s.t.takeWarm(ww.Dir)
		if rw == nil {
			rw = &runWorkspace{dir: ww.Dir, volume: ww.Volume.Name, mib: prof.WorkspaceMiB, vol: ww.Volume, tool: ww.Tool, toolDigest: ww.ToolDigest}
		}
		s.own(rw)
		if rw.captureC != nil {
			// Its capture container, made with the warm container, is
			// the run's now. It waits already: it learns the run here,
			// once signalled.
			s.hold(live.ContainerKey + rw.capture.Name)
			if err := os.WriteFile(filepath.Join(rw.in(), runIDFile), []byte(s.run.ID()+"\n"), 0o444); err != nil {
				return nil, stageError(err, false)
			}
		}
		return rw, nil
	}
	rw := &runWorkspace{dir: s.t.workspaceDir(s.run), volume: spec.Name + "-ws", mib: prof.WorkspaceMiB}
	var err error
	if rw.tool, rw.toolDigest, err = s.t.tools.Stage(s.t.toolSrc); err != nil {
		return nil, fmt.Errorf("workspace tool: %w", err)
	}
	s.own(rw)
	if err := s.t.newWorkspace(ctx, rw, prof, spec.Labels); err != nil {
		return nil, err
	}
	return rw, nil
}

// own holds rw's directory, volume and tool for the run and makes it the
// run's (Release gives up what follows, whatever fails).
func (s *Stage) own(rw *runWorkspace) {
	s.hold(holdDir + rw.dir)
	s.hold(holdVolume + rw.volume)
	s.hold(holdTool + rw.toolDigest)
	s.rw = rw
}

// newWorkspace makes rw's directories and its tmpfs volume of the
// profile's workspace_mib, owned by the profile's user and labelled with
// labels (jail.LabelRole set to jail.RoleWorkspace). The volume exists
// before any container that mounts it is created: a container created
// first would make the engine create it (from the mount's spec), and
// CreateVolume's removal of a leftover would then find it in use.
func (t *Trees) newWorkspace(ctx context.Context, rw *runWorkspace, prof *profile.Profile, labels map[string]string) error {
	uid, gid := prof.Owner()
	if err := makeWorkspaceDirs(rw, uid, gid); err != nil {
		return stageError(err, false)
	}
	rw.vol = jail.VolumeSpec{Name: rw.volume, SizeBytes: rw.mib << 20, UID: uid, GID: gid,
		Inodes: 2*int64(t.cfg.MaxFiles) + 10000, Labels: maps.Clone(labels)}
	rw.vol.Labels[jail.LabelCreated] = time.Now().UTC().Format(time.RFC3339Nano)
	rw.vol.Labels[jail.LabelRole] = jail.RoleWorkspace
	if err := t.rt.CreateVolume(ctx, rw.vol); err != nil {
		return stageError(fmt.Errorf("create the workspace volume: %w", err), errors.Is(err, jail.ErrPermanent))
	}
	return nil
}

// MakeWarm makes the workspace of a warm container whose spec is spec
// (its name and labels set), of profile prof (worker/warm): a directory
// under StateDir/ws named after the container, its empty volume (name +
// "-ws"), the staged tool, held until release, the mounts a workspace
// run's container has (workspaceMounts), its snapshot input still empty,
// and its capture container (name + "-capture", captureSpec of spec),
// started and waiting, so that a run claiming the container starts no
// container at all. The run that claims the container takes them over
// (stage.WarmWorkspace.Take, in Prestart); ww.Alive reports false once the
// capture container exited, and the pool then never hands the container
// out. release gives up the holds, and removes the capture container, the
// volume and the directory when remove is set (the container unused,
// removed first).
func (t *Trees) MakeWarm(ctx context.Context, spec jail.ContainerSpec, prof *profile.Profile) (ww *stage.WarmWorkspace, release func(remove bool), err error) {
	name := spec.Name
	rw := &runWorkspace{dir: filepath.Join(t.stateDir, "ws", name), volume: name + "-ws", mib: prof.WorkspaceMiB}
	if rw.tool, rw.toolDigest, err = t.tools.Stage(t.toolSrc); err != nil {
		return nil, nil, fmt.Errorf("workspace tool: %w", err)
	}
	releases := []func(){t.holds.Hold(holdTool + rw.toolDigest), t.holds.Hold(holdDir + rw.dir), t.holds.Hold(holdVolume + rw.volume),
		t.holds.Hold(live.ContainerKey + name + "-capture")}
	made := false
	release = func(remove bool) {
		t.takeWarm(rw.dir)
		if remove {
			if rw.started != nil {
				_ = rw.started.Close()
			}
			rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if rw.captureC != nil {
				if err := rw.captureC.Remove(rctx); err != nil {
					t.log.Warn().Err(err).Str("name", name+"-capture").Msg("remove warm capture container; the reconciler will retry")
				}
				rw.stopWait()
				rw.captureOut.close()
			}
			if made {
				if err := t.rt.RemoveVolume(rctx, rw.volume); err != nil {
					t.log.Warn().Err(err).Str("volume", rw.volume).Msg("remove warm workspace volume; the reconciler will retry")
				}
			}
			if err := os.RemoveAll(rw.dir); err != nil {
				t.log.Warn().Err(err).Str("dir", rw.dir).Msg("remove warm workspace directory")
			}
		}
		for _, r := range releases {
			r()
		}
	}
	if err := t.newWorkspace(ctx, rw, prof, spec.Labels); err != nil {
		made = !errors.Is(err, jail.ErrPermanent)
		release(true)
		return nil, nil, err
	}
	made = true
	// The longest run after a day's wait; a pool replaces an idle one
	// long before (warm.Config.MaxIdle), and the reconciler removes one a
	// crashed worker left.
	rw.capture = captureSpec(spec, rw, t.cfg, 24*time.Hour+messages.MaxTimeout+t.stopGrace+t.cfg.CaptureTimeout)
	if err := t.startCaptureContainer(ctx, rw); err != nil {
		release(true)
		return nil, nil, stageError(err, errors.Is(err, jail.ErrPermanent))
	}
	ww = &stage.WarmWorkspace{Dir: rw.dir, Volume: rw.vol, Tool: rw.tool, ToolDigest: rw.toolDigest,
		Alive: func() bool { return !rw.captureDead.Load() }}
	rw.vol = ww.Volume
	for _, m := range workspaceMounts(rw) {
		ww.Mounts = append(ww.Mounts, m.Mount)
	}
	t.warmMu.Lock()
	t.warm[rw.dir] = rw
	t.warmMu.Unlock()
	return ww, release, nil
}

// takeWarm returns the workspace MakeWarm made in dir, with its capture
// container, once: nil after that (or for another directory).
func (t *Trees) takeWarm(dir string) *runWorkspace {
	t.warmMu.Lock()
	defer t.warmMu.Unlock()
	rw := t.warm[dir]
	delete(t.warm, dir)
	return rw
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
	if err := errors.Join(os.Chown(rw.scratch(), uid, gid), os.Chmod(rw.scratch(), 0o755), os.Chmod(rw.in(), 0o755), os.Chmod(rw.gate(), 0o755)); err != nil {
		return err
	}
	return rw.listenStarted()
}

// listenStarted opens the gate's workspace.StartedSocket, which the run's
// user may connect to (mode 0666 in a directory only the worker writes).
func (rw *runWorkspace) listenStarted() error {
	sock := filepath.Join(rw.gate(), workspace.StartedSocket)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return fmt.Errorf("started socket: %w", err)
	}
	rw.started = ln
	return os.Chmod(sock, 0o666)
}

// Release removes the capture container (or waits for its removal
// to end), then the delivery's volume and directory, and gives up its
// snapshot and tool. The run's own container is gone by then (release's
// order), so the volume is free. A volume that cannot be removed is left
// to the reconciler. The directory's removal never follows a symlink
// (os.RemoveAll works relative to directory descriptors and unlinks
// symlinks as they are).
func (s *Stage) Release(*stage.ReleaseRequest) {
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
