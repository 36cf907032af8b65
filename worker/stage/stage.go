// Package stage is the contract between the run engine (worker/runner) and
// the stages of a run, after Nomad's task runner hooks
// (client/allocrunner/taskrunner): each stage is its own type in its own
// package (worker/stage/...), built for one delivery of a request from the
// request and the resolved profile, and implements only the hooks it needs.
// The engine builds the list once per run, in one place, calls the hooks in
// list order (Release in reverse order), and owns the run's record: a stage
// returns what it adds (environment, mounts, an argument prefix, a stop, a
// reason) and writes only its own part of the record (Noter), never another
// stage's. No stage package imports another.
//
// The order of a run:
//
//	acquire    the engine acquires the run's placement (Run.Placement):
//	           cold, or a warm container the run claimed
//	Prestart   each Prestarter, in order; the engine merges the responses
//	           into the container spec and the receipt
//	start      the engine creates and starts the container, or hands the
//	           warm container the run
//	Poststart  each Poststarter; then cancels and checks may stop it, and
//	           the run is recorded running
//	Check      each Checker, periodically, while the container runs
//	exit       the engine classifies the exit from plain facts (exit
//	           status, stops, timeout), knowing no stage
//	Exited     each Exiter, when the container exited on its own or was
//	           stopped (not on a worker shutdown); each may amend the
//	           outcome (a reason, a final outcome failed, the agent never
//	           ran, a retry)
//	Note       each Noter, before every write of the run's record
//	Release    each Releaser, once, in reverse order, after the engine
//	           removed the container
package stage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
)

// Stage is one stage of one run. It implements any of Prestarter,
// Poststarter, Checker, MCPObserver, AnswerObserver, Exiter, Noter and
// Releaser.
type Stage interface {
	// Name names the stage in logs ("coordination", "workspace", ...).
	Name() string
}

// Run is one delivery of a run request as its stages see it. The engine
// fills it before the first hook; nothing changes it afterwards (what
// Progress and Holds point to changes, as their docs say).
type Run struct {
	// Request is the admitted request, its ID set.
	Request messages.RunRequest
	// Profile is the resolved profile the request names.
	Profile *profile.Profile
	// Plan is the backend's plan for the run (argv, files, launcher), as
	// the engine made it before the first hook. A follow-up the workspace
	// stage resumes (PrestartResponse.Resume) runs the plan's argv with
	// the CLI's resume flag (profile.Profile.Resume), which the
	// container's command carries and Plan does not: a resume changes
	// Argv alone, which no stage reads.
	Plan profile.Plan
	// Seq is the request's JETCREW_RUNS stream sequence; Attempt its
	// delivery number, from 1.
	Seq     uint64
	Attempt int
	// Timeout bounds the run's container.
	Timeout time.Duration
	// Labels are the run container's labels (jail.LabelRunID, ...):
	// helper containers and volumes of the run carry them too.
	Labels map[string]string
	// Progress is when the run last showed progress (output, coordination
	// traffic); the engine touches it.
	Progress *Progress
	// Holds counts what the worker's live runs hold; a stage holds what
	// it makes for the run (a directory, a volume, a cached file) until
	// its Release, so the reconciler spares it.
	Holds *Holds
	// Log is the run's logger.
	Log zerolog.Logger
	// Failpoint is called with the name of each crash point the run
	// passes (worker/runner's Failpoint constants); never nil.
	Failpoint func(name string)
	// Placement is where the run's container comes from, acquired by the
	// engine before the first hook: cold, or a warm container the run
	// claimed, whose parts the stages take over.
	Placement Placement
}

// ID returns the run's id.
func (r *Run) ID() string { return r.Request.ID }

// Key returns 16 hex digits of the SHA-256 of the run's id, stream
// sequence and delivery number: a name for what the run makes on the host
// that is unique per delivery and short enough for a unix socket path.
func (r *Run) Key() string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d", r.Request.ID, r.Seq, r.Attempt))
	return hex.EncodeToString(sum[:8])
}

// Crash points a run passes, in order, named to Run.Failpoint (and the
// worker's Config.Failpoint), so crash tests can kill the worker process
// exactly there.
const (
	FailpointAfterFetch      = "after-fetch"       // request received, nothing recorded
	FailpointAfterStage      = "after-stage"       // workspace staged, container not created
	FailpointBeforeStart     = "before-start"      // run claimed and staged, its start not yet decided
	FailpointAfterStart      = "after-start"       // container created and started
	FailpointRunning         = "running"           // running state recorded
	FailpointAfterExit       = "after-exit"        // process exited, result not recorded
	FailpointAfterCapture    = "after-capture"     // workspace result stored, final state not recorded
	FailpointAfterResult     = "after-result"      // final state recorded, request not removed
	FailpointAfterDeadLetter = "after-dead-letter" // dead letter published, request not removed
)

// Prestarter is a stage with work before the run's container is created:
// staging files, sockets, volumes or helper containers, and what it adds to
// the container.
type Prestarter interface {
	Stage
	// Prestart stages what the run needs and says, in resp, what the
	// container gets. An error wrapped by Transient hands the request back
	// for a retry; any other error fails the run with its text as the
	// reason. What was made before an error is given up by Release.
	Prestart(ctx context.Context, req *PrestartRequest, resp *PrestartResponse) error
}

// PrestartRequest is what a Prestarter reads.
type PrestartRequest struct {
	// Run is the run.
	Run *Run
	// Spec is the run's container spec as the engine built it from the
	// profile and the plan, before any stage's additions. Read-only.
	Spec *jail.ContainerSpec
	// Dir is the run's directory once the run-directory stage staged it;
	// nil before that stage, and for a run that has none.
	Dir Dir
	// Mask is the run's secret mask once the secrets stage made it; nil
	// before that stage, and for a run without secrets. A stage that
	// keeps it uses only its String, and only once the run's container
	// has exited (the engine's output no longer uses it).
	Mask Masker
}

// PrestartResponse is what a Prestarter adds to the run's container.
type PrestartResponse struct {
	// Env are KEY=VALUE entries appended to the container's environment,
	// after the engine's own (so none overrides JETCREW_*).
	Env []string
	// LaunchEnvNames name the variables the launcher sets in the agent's
	// environment at start (profile.Plan.EnvFile), for the receipt: their
	// values are in no container configuration and no record.
	LaunchEnvNames []string
	// Mounts are appended to the container's mounts.
	Mounts []Mount
	// Files are the files the stage staged for the container, by path in
	// the container and mode (never their contents), for the receipt:
	// listed before the plan's own (profile.Plan.Files).
	Files []messages.ReceiptFile
	// Wrap, when set, becomes the head of the container's command: the
	// command so far follows it (`jetcrew workspace exec ... --`).
	Wrap []string
	// WorkingDir, when set, is the container's working directory.
	WorkingDir string
	// Dir is the run's directory (the run-directory stage only).
	Dir Dir
	// Mask masks the run's secrets in everything it shows (the secrets
	// stage only); nil masks nothing.
	Mask Masker
	// Resume, when set, is the agent CLI's session id the run resumes (the
	// workspace stage, for a follow-up): the engine passes it to the
	// CLI's resume flag (profile.Profile.Resume) in the container's
	// command; Run.Plan stays as it was.
	Resume string
}

// Mount is a mount a stage adds, with what the receipt says of it.
type Mount struct {
	jail.Mount
	// Role is one of messages.MountRole*.
	Role string
	// Digest is "sha256:<hex>" of what is mounted, when the role has one.
	Digest string
}

// Poststarter is a stage with work once the run's container started.
type Poststarter interface {
	Stage
	// Poststart is called once the container started, before the engine
	// lets cancels and checks stop it and records the run running. An
	// error stops the start: the container is removed and the error
	// recorded as Prestart's are.
	Poststart(ctx context.Context, req *PoststartRequest) error
}

// PoststartRequest is what a Poststarter reads.
type PoststartRequest struct {
	// Run is the run.
	Run *Run
	// Container is the run's started container.
	Container jail.Container
	// Cancelled reports whether a cancel of the run has arrived.
	Cancelled func() bool
}

// Checker is a stage that watches the run while its container runs.
type Checker interface {
	Stage
	// CheckEvery is how often the stage wants Check called.
	CheckEvery() time.Duration
	// Check is called about every CheckEvery while the container runs,
	// from one goroutine at a time. A non-nil stop asks the engine to stop
	// the run; changed says the stage's part of the record changed, which
	// the engine then writes (through Note).
	Check(now time.Time) (stop *Stop, changed bool)
}

// MCPObserver is a stage told what the agent CLI reported of the jetcrew
// MCP server's status (Claude Code's init event).
type MCPObserver interface {
	Stage
	// MCPStatus is called once, from the output goroutine, with the
	// status the CLI reported ("connected", "failed", ...); a non-nil
	// Stop asks the engine to stop the run.
	MCPStatus(status string) *Stop
}

// AnswerObserver is a stage told the agent CLI's first answer from its
// model (profile.Parser.OnFirstAnswer: a model's answer, or the model
// API's refusal of the request).
type AnswerObserver interface {
	Stage
	// FirstAnswer is called once, from the output goroutine; a non-nil
	// Stop asks the engine to stop the run.
	FirstAnswer(a profile.Answer) *Stop
}

// Stop is a stage's request to stop a run, and the final state it leads
// to. The first stop asked for wins; one Check round that finds several
// takes the most overdue.
type Stop struct {
	// State is the run's final state: messages.StateStalled,
	// messages.StateFailed.
	State messages.State
	// Reason is the run's reason.
	Reason string
	// Overdue is how long past its bound the stage found the run.
	Overdue time.Duration
}

// Exiter is a stage with work once the run's container has exited.
type Exiter interface {
	Stage
	// Exited is called once the container exited on its own or was
	// stopped (a cancel, a stop, the timeout), before the outcome is
	// recorded; never on a worker shutdown or a failed wait.
	Exited(ctx context.Context, req *ExitedRequest, resp *ExitedResponse)
}

// ExitedRequest is what an Exiter reads.
type ExitedRequest struct {
	// Run is the run.
	Run *Run
	// Final is true when the run ends now (false: it is retried).
	Final bool
	// State and Reason are the outcome the engine classified.
	State  messages.State
	Reason string
	// Status is the container's exit status (after the stop, for a
	// stopped run).
	Status jail.ExitStatus
	// LastErr is the last non-empty line of the container's stderr, at
	// most 200 bytes: where the workspace stage reads the in-jail tool's
	// exit line.
	LastErr string
	// NotRun is true when a stage before this one said the agent never
	// ran (ExitedResponse.NotRun): a rule about how the agent ended does
	// not apply.
	NotRun bool
	// StopFailed is true when the container could not be stopped: its
	// processes may still run.
	StopFailed bool
	// Stopped is true when the process did not exit on its own: a cancel,
	// a stage's stop or the run's timeout stopped the container.
	Stopped bool
}

// ExitedResponse is what an Exiter changes of the outcome. The engine calls
// the Exiters in list order; each sees in its ExitedRequest the outcome as
// the ones before it left it.
type ExitedResponse struct {
	// Reason, when set, replaces the outcome's reason (a stage that can
	// say more of why).
	Reason string
	// Fail, when set, ends a run that ends now (ExitedRequest.Final)
	// failed, whatever the engine classified, with Reason (which must be
	// set) as its reason: a stage's own rule of how a run may not end
	// (coordination: an agent that exited before it reached its bridge).
	// A cancelled run stays cancelled, and a run handed back for another
	// delivery is handed back: Fail, and its Reason, are then ignored.
	Fail bool
	// NotRun, when set, says the agent never ran: the container's command
	// ended before it started the agent (the workspace stage: the
	// snapshot did not unpack). Unless Retry is set too, the run then ends
	// now, failed, with Reason (which must be set), whatever the engine
	// classified, a retry the profile's retries asked for included (they
	// retry the agent, which did not run). A cancelled run stays
	// cancelled. Later stages see it (ExitedRequest.NotRun).
	NotRun bool
	// Retry, when set, hands the request back for another delivery (with
	// backoff, as the engine retries an engine it cannot reach), with
	// Reason (which must be set) as its cause, whatever the engine
	// classified: a failure of the worker's, not the run's (the workspace
	// stage: no capture container held the workspace in time). A
	// cancelled run stays cancelled.
	Retry bool
}

// Noter is a stage that owns part of the run's record.
type Noter interface {
	Stage
	// Note writes the stage's own fields into st, before every write of
	// the record; st.State is the state being written.
	Note(st *messages.RunState)
}

// Releaser is a stage holding something until the run ends.
type Releaser interface {
	Stage
	// Release gives up what the stage made, once, after the engine removed
	// the run's container (or found it could not), in reverse list order.
	Release(req *ReleaseRequest)
}

// ReleaseRequest is what a Releaser reads.
type ReleaseRequest struct {
	// Run is the run.
	Run *Run
	// Final is true when the run ended; false when its request is handed
	// back for another delivery (a retry, a shutdown).
	Final bool
	// ContainerGone is true when the run's container was removed (or
	// never made): nothing of it mounts what the stages made.
	ContainerGone bool
	// Leave is true when the worker stops leaving the run, its container
	// running, to a successor that adopts it (Adopter): a stage gives up
	// only what lives in the worker's process (listeners, goroutines,
	// holds) and keeps everything the container uses or the successor
	// needs (the run's directory, volumes, helper containers, its
	// presence in its group). Final and ContainerGone are false.
	Leave bool
}

// Adopter is a stage that can take its part of a run over from another
// worker process: the run's container runs on, started by a worker that
// has since stopped or died, and a worker on the same engine adopts it
// (worker/runner's Adopt, issue 38). Adopt is called, in list order,
// instead of Prestart and Poststart; the other hooks follow as for any
// run. A run whose list holds a Prestarter or Poststarter that is not an
// Adopter cannot be adopted: its container is removed and its request
// runs again, as before adoption existed.
type Adopter interface {
	Stage
	// Adopt takes over what the stage made for the run and the container
	// uses, found where the run's record and container say (AdoptRequest),
	// and serves again what lived in the dead worker's process (sockets,
	// listeners). resp carries what Prestart's would that later stages
	// read (Dir, Mask); the container's spec is not changed. An error
	// makes the run not adoptable (handled as a lost run); what was taken
	// before it is given up by Release.
	Adopt(ctx context.Context, req *AdoptRequest, resp *PrestartResponse) error
}

// AdoptRequest is what an Adopter reads.
type AdoptRequest struct {
	// Run is the run, built from its record and request as a delivery's
	// is.
	Run *Run
	// State is the run's record as the adopting worker read it: how far
	// the run got (BridgeConnected, Usage, StartedAt, ...).
	State messages.RunState
	// RunDir is the host directory mounted at messages.ContainerRunDir
	// in the run's container (the dead worker's run directory); "" when
	// the container has none.
	RunDir string
	// Mounts are the run container's bind and volume mounts as the
	// runtime found them (jail.Found.Mounts).
	Mounts []jail.Mount
	// Spec is the run container's spec as the profile and the request
	// make it, before any stage's additions (as PrestartRequest.Spec),
	// with the container's name and labels as found. Read-only.
	Spec *jail.ContainerSpec
	// Container is the adopted container, running.
	Container jail.Container
	// Dir and Mask are as in PrestartRequest.
	Dir  Dir
	Mask Masker
}

// TransientError marks a stage's failure as one a later delivery may not
// meet (infrastructure: an engine or a store unreachable): the engine hands
// the request back for a retry instead of failing the run.
type TransientError struct{ Err error }

func (e TransientError) Error() string { return e.Err.Error() }
func (e TransientError) Unwrap() error { return e.Err }

// Transient wraps err as a TransientError.
func Transient(err error) error { return TransientError{err} }

// Progress records when a run last showed progress: output or coordination
// traffic. It drives the stall watchdog. Safe for concurrent use; the
// methods of a nil *Progress do nothing (Since: none).
type Progress struct {
	last atomic.Int64 // UnixNano
	held atomic.Int64 // Holds not yet released
}

// Touch records progress now.
func (p *Progress) Touch() {
	if p != nil {
		p.last.Store(time.Now().UnixNano())
	}
}

// Since returns how long ago the last progress was: 0 while a Hold is in
// place.
func (p *Progress) Since() time.Duration {
	if p == nil || p.held.Load() > 0 {
		return 0
	}
	return time.Duration(time.Now().UnixNano() - p.last.Load())
}

// Hold stops the clock while the run waits on something outside it (the
// egress proxy holds its model request at a budget, on_budget = "pause"):
// a wait that is no stall of the run's. The clock starts again from the
// release of the last hold (release touches); release is safe to call
// twice.
func (p *Progress) Hold() (release func()) {
	if p == nil {
		return func() {}
	}
	p.held.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			p.Touch()
			p.held.Add(-1)
		})
	}
}
