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
	"os"
	"path/filepath"
	"sync"
	"time"

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
	// InUse reports whether a container on the engine bind-mounts a path
	// under a directory: Sweep spares such a delivery directory (a run
	// left by an earlier process, which this worker may be adopting).
	// Nil: none does.
	InUse func(dir string) bool
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
	inUse     func(dir string) bool

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
		holds: d.Holds, log: d.Log, runState: d.RunState, profiles: d.Profiles, inUse: d.InUse,
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
// included) that no container mounts (Deps.InUse: a run left running by
// an earlier process, to adopt), cached snapshots whose last use is that
// old, and staged tools.
func (t *Trees) Sweep(grace time.Duration) {
	root := filepath.Join(t.stateDir, "ws")
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		dir := filepath.Join(root, e.Name())
		info, err := e.Info()
		if err != nil || t.holds.Held(holdDir+dir) || t.holds.Held(holdGitFile+dir) || time.Since(info.ModTime()) < grace ||
			t.inUse != nil && t.inUse(dir) {
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
	_ stage.Adopter        = (*Stage)(nil)
)

// Name returns "workspace".
func (s *Stage) Name() string { return "workspace" }

// hold holds key for the run until Release.
func (s *Stage) hold(key string) { s.releases = append(s.releases, s.run.Holds.Hold(key)) }
