package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// run is one delivery of one request being handled.
type run struct {
	// cancelled is set when a cancel request stopped the run's container.
	cancelled atomic.Bool
	// mcpProved is set when the agent CLI reported the jetcrew MCP server
	// connected.
	mcpProved atomic.Bool
	// container is the run's container once started.
	container Container
	// prog records the last progress, for the stall watchdog.
	prog *progress
	// cs is the run's staged directory and coordination session, once
	// prepare staged them.
	cs *coordSession
	// ws is the delivery's staged workspace, when the request names one
	// (see workspace.go).
	ws *runWorkspace
	// egressSess is the run's egress proxy, for an egress profile
	// (egress.go).
	egressSess *egress.Session
	// releaseOnce makes release give up the run's resources once.
	releaseOnce sync.Once
	// containerGone is set by release once the run's container was
	// removed: nothing of it mounts the run's directory any more.
	containerGone bool
	// stopFailed is set by supervise when stopping the run's container
	// failed: it may still run, so its workspace is not captured.
	stopFailed bool
	// bridge is the SHA-256 (hex) of the staged bridge the run mounts, if
	// any: set before the run is tracked, read by the bridge's gc.
	bridge string
	// from is the state this delivery holds the run in: the origin of its
	// next transition (messages.StateNone before any record exists).
	from messages.State
	// stopKind and stopReason say which watchdog stopped the run.
	stopMu     sync.Mutex
	stopKind   string
	stopReason string
	// mask masks the run's secrets in what it shows (mask.go).
	mask *masker
	// startedStored is closed once the started event is stored (or its
	// publish failed for good); nil before publishStarted.
	startedStored chan struct{}
	// startCommitted is set, under w.mu, once the run's container may
	// start: a cancel then stops it rather than preventing it
	// (startclaim.go).
	startCommitted bool
	// rev is the bucket revision of the run's state as this delivery last
	// wrote it: the lease. 0 means no state exists yet.
	rev   uint64
	w     *Worker
	msg   jetstream.Msg
	meta  *jetstream.MsgMetadata
	req   messages.RunRequest
	state messages.RunState
	log   zerolog.Logger
}

// execute runs a claimed request in four steps: prepare (plan, spec,
// receipt, staging), start (the container and the running state), supervise
// (wait, timeout, cancel and watchdogs, down to plain exit facts) and
// conclude (classify the facts, then record). A step that fails records the
// outcome through abort. What the run holds is given up by release, in the
// order it states; the deferred call is only a safety net for paths that
// ended without recording (the run state changed under this delivery).
func (r *run) execute(ctx context.Context, prof Profile) {
	defer r.waitStarted()
	defer func() { r.release(r.state.State.Final()) }()
	defer r.w.untrack(r)
	p, err := r.prepare(ctx, prof)
	if err != nil {
		r.abort(ctx, err)
		return
	}
	s, err := r.start(ctx, p)
	if err != nil {
		r.abort(ctx, err)
		return
	}
	facts := r.supervise(ctx, p, s)
	r.conclude(ctx, p, facts)
}

// prepared is what prepare makes of a request before anything starts.
type prepared struct {
	prof    Profile
	plan    AgentPlan
	spec    ContainerSpec
	timeout time.Duration
	coordOn bool
}

// started is a run's live container and the readers of its output.
type started struct {
	c      Container
	out    *outputPublisher
	parser *agentParser
}

// errRecorded is returned by a step that has already recorded the run's
// outcome (or found it no longer this delivery's to record): abort does
// nothing more.
var errRecorded = errors.New("outcome already recorded")

// transientError marks a step's failure as one a later delivery may not
// meet (infrastructure): abort hands the request back for a retry.
type transientError struct{ err error }

func (e transientError) Error() string { return e.err.Error() }
func (e transientError) Unwrap() error { return e.err }

// abort records the outcome of a step's error: nothing for errRecorded, a
// retry for a transientError, the run failed for any other error (its text
// is the reason).
func (r *run) abort(ctx context.Context, err error) {
	var te transientError
	switch {
	case errors.Is(err, errRecorded):
	case errors.As(err, &te):
		r.retry(ctx, te.err)
	default:
		r.fail(ctx, err.Error(), nil)
	}
}

// runTimeout is the bound of a run: the request's timeout, else the
// profile's, else the worker's default.
func runTimeout(req messages.RunRequest, prof Profile, def time.Duration) time.Duration {
	if req.Timeout != 0 {
		return time.Duration(req.Timeout)
	}
	if prof.timeout != 0 {
		return prof.timeout
	}
	return def
}

// prepare plans the agent's command line, builds the container spec and the
// receipt, checks the bridge and stages the run directory (and its
// coordination session). Every outcome carries the receipt, a failure here
// included: it describes the plan until the spec exists.
func (r *run) prepare(ctx context.Context, prof Profile) (prepared, error) {
	w := r.w
	attempt := int(r.meta.NumDelivered)
	if attempt > 1 {
		// An earlier delivery's container belongs to a worker that lost the
		// run (it died or missed AckWait): remove it before starting ours so
		// two containers of one run never overlap.
		if err := w.removeRunContainers(ctx, r.req.ID); err != nil {
			return prepared{}, transientError{fmt.Errorf("remove earlier containers: %w", err)}
		}
	}
	p := prepared{prof: prof, timeout: runTimeout(r.req, prof, w.cfg.DefaultTimeout), coordOn: prof.CoordinationOn()}
	r.mask = newMasker(prof, w.cfg.LookupEnv)
	r.state.Coordination = "off"
	plan, err := planAgent(prof, r.req.Prompt, p.coordOn)
	digest := w.profileDigest(r.req.Profile, prof)
	r.state.Receipt = buildReceiptDigest(prof, digest, plan, ContainerSpec{}, p.timeout, r.req.Prompt)
	if err != nil {
		return p, err
	}
	p.plan = plan
	in := SpecInput{
		Profile: prof, Request: r.req, Seq: r.meta.Sequence.Stream, Attempt: attempt, WorkerID: w.cfg.ID, Install: w.install,
		Now: time.Now(), LookupEnv: w.cfg.LookupEnv, Plan: plan, Coordination: p.coordOn,
	}
	if p.coordOn || plan.Launch || plan.EgressRelay {
		// The bridge runs from its content-addressed copy, never from the
		// operator's build output.
		if in.BridgePath, r.bridge, err = w.bridges.stage(w.cfg.BridgePath); err != nil {
			return p, err
		}
	}
	if p.coordOn || len(plan.Files) > 0 || plan.EgressRelay {
		in.RunDir = r.dir()
	}
	if p.spec, err = BuildSpec(in); err != nil {
		return p, err
	}
	if err := r.stageWorkspace(ctx, &p.spec, prof); err != nil {
		return p, err
	}
	r.state.Receipt = buildReceiptDigest(prof, digest, plan, p.spec, p.timeout, r.req.Prompt)
	r.state.Receipt.WorkspaceGit = r.state.WorkspaceGit
	if r.bridge != "" {
		r.state.Receipt.BridgeDigest = "sha256:" + r.bridge
	}
	if in.RunDir != "" {
		// The session is the run's from here on, staged or not: release
		// ends it and removes the directory.
		r.cs, err = r.stageRun(ctx, plan, p.coordOn)
		if err != nil {
			return p, err
		}
		if err := r.openEgress(ctx, prof, r.cs.dir); err != nil {
			return p, err
		}
	}
	return p, nil
}

// start starts the container with its output wired to the output events,
// the agent parser and the stall watchdog, records the running state and
// publishes the started event.
func (r *run) start(ctx context.Context, p prepared) (started, error) {
	w := r.w
	r.prog = &progress{}
	r.prog.touch()
	s := started{
		parser: newAgentParser(p.prof.Backend, r.agentEvent, r.onMCPStatus),
		out:    newOutputPublisher(w.js, r.req.ID, r.meta.Sequence.Stream, int(r.meta.NumDelivered)),
	}
	s.out.budget = p.prof.MaxOutputBytes()
	s.out.mask, s.out.onStdout = r.mask, s.parser.feed // the parser sees masked output
	output := func(stream string, b []byte) {
		r.prog.touch()
		s.out.write(stream, b)
	}
	if !r.commitStart(ctx) {
		_, _ = s.out.close(ctx)
		return s, errRecorded
	}
	c, err := w.cfg.Runtime.Start(ctx, p.spec, output)
	if err != nil {
		_, _ = s.out.close(ctx)
		if r.cancelledBeforeStart(ctx) {
			return s, errRecorded
		}
		if errors.Is(err, ErrPermanent) {
			return s, err
		}
		return s, transientError{fmt.Errorf("start container: %w", err)}
	}
	s.c = c
	r.state.Receipt.ImageID = c.ImageID()
	herr := r.holdWorkspace() // workspace_jail.go
	r.setContainer(c)
	if herr != nil {
		// The run's container waits in exec, nothing unpacked: release
		// removes it.
		_, _ = s.out.close(ctx)
		if r.cancelledBeforeStart(ctx) {
			return s, errRecorded
		}
		return s, herr
	}
	if r.startedCancelled(c) {
		r.stopContainer(c)
	}
	w.failpoint(FailpointAfterStart)
	w.metrics.started.Inc()
	w.metrics.queueWait.Observe(time.Since(r.meta.Timestamp).Seconds())
	if err := r.toRunning(ctx, c.ID()); err != nil {
		if errors.Is(err, errFenced) {
			r.lost(ctx, s.out)
			return s, errRecorded
		}
		r.log.Warn().Err(err).Msg("record running state")
	}
	w.failpoint(FailpointRunning)
	r.publishStarted(ctx, c.ID(), s.out)
	if r.cs != nil && r.cs.sess != nil {
		if err := r.cs.sess.SetState(ctx, messages.StateRunning); err != nil {
			r.log.Warn().Err(err).Msg("coordination presence")
		}
	}
	r.log.Info().Str("container_id", shortID(c.ID())).Str("profile", p.prof.Name).Msg("run started")
	return s, nil
}

// onMCPStatus takes the agent CLI's report of the jetcrew MCP server's
// status: connected proves the bridge; anything else stops the run, which
// would otherwise work without coordination.
func (r *run) onMCPStatus(status string) {
	if status != "connected" {
		r.stopFor(stopBridge, fmt.Sprintf("the agent CLI reports MCP server %s as %q: it would work without coordination", coordination.MCPServerName, status))
		return
	}
	r.mcpProved.Store(true)
}

// supervise waits for the container's end (bounded by the run's timeout),
// with the watchdogs on, and stops the container when a cancel, a watchdog,
// the timeout or a worker shutdown ended the wait. It returns the exit
// facts, the output closed; it records nothing.
func (r *run) supervise(ctx context.Context, p prepared, s started) exitFacts {
	// The stall clock starts with the watchdogs, once the container runs:
	// a container the engine was slow to create or start (seconds under
	// load) has not been idle meanwhile.
	r.prog.touch()
	stopWatch := r.watch(p.prof, p.prof.bridgeRequired(), r.cs, r.prog)
	waitCtx, cancelWait := context.WithTimeout(ctx, p.timeout)
	status, err := s.c.Wait(waitCtx)
	cancelWait()
	stopWatch()
	r.w.failpoint(FailpointAfterExit)
	f := exitFacts{Cancelled: r.cancelled.Load(), Timeout: p.timeout}
	f.StopKind, f.StopReason = r.stopped()
	switch {
	case err == nil:
	case f.Cancelled || f.StopKind != stopNone:
		// A cancel request or a watchdog stopped the container (SIGTERM,
		// grace, SIGKILL); wait for that to finish.
		if status, err = r.stopAndWait(s.c); err != nil {
			r.log.Warn().Err(err).Msg("stop container")
			r.stopFailed = true
		}
	case ctx.Err() != nil:
		// The worker is shutting down hard.
		f.Shutdown = true
		_, _ = r.stopAndWait(s.c)
	case errors.Is(err, context.DeadlineExceeded):
		f.TimedOut = true
		if status, err = r.stopAndWait(s.c); err != nil {
			r.log.Warn().Err(err).Msg("stop timed-out container")
			r.stopFailed = true
		}
	default:
		f.WaitErr = err
	}
	f.Status = status
	f.Result, f.Summary = s.parser.outcome()
	f.LastErr = s.out.lastErrLine()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*opMaxElapsed)
	defer cancel()
	f.OutputBytes, f.OutputErr = s.out.close(cctx)
	r.noteDroppedOutput(s.out)
	f.BridgeConnected = r.cs.connected()
	return f
}

// conclude classifies the exit facts and records the outcome: a final
// state, a retry, or a hand-back on shutdown.
func (r *run) conclude(ctx context.Context, p prepared, f exitFacts) {
	o := classify(f, outcomePolicy{
		Attempt: int(r.meta.NumDelivered), Retries: p.prof.Retries, WorkerID: r.w.cfg.ID, Spec: p.spec, WorkspaceMiB: p.prof.WorkspaceMiB,
	})
	if f.WaitErr == nil && !f.Shutdown {
		r.state.Result, r.state.Agent = clipResult(f.Result), f.Summary
		r.state.ExitCode = &f.Status.Code
		r.state.OOMKilled = f.Status.OOMKilled
		r.state.OutputBytes = f.OutputBytes
		r.state.BridgeConnected = f.BridgeConnected
		if r.state.Coordination == "available" && !f.BridgeConnected && !p.prof.bridgeRequired() {
			// The profile let the run go without its bridge, and it did.
			r.state.Coordination = "unused"
		}
		if f.OutputErr != nil {
			r.log.Warn().Err(f.OutputErr).Msg("some output events were not acknowledged")
		}
	}
	switch o.Action {
	case actionHandBack:
		r.handBack(ctx, o.Reason)
	case actionRetry:
		// The container is gone with the retry: the next delivery starts
		// its own.
		r.state.ContainerID = ""
		r.retry(ctx, errors.New(o.Reason))
	default:
		r.finish(ctx, o.State, r.captureWorkspace(ctx, o))
	}
}

// release gives up what the run holds, once, in this order: its container
// (removed), its egress proxy, its coordination session (closed when the run is final,
// detached when it is handed back), its run directory. The caller records
// the state first and removes the request from the stream after.
func (r *run) release(final bool) {
	r.releaseOnce.Do(func() {
		if c := r.currentContainer(); c != nil {
			r.containerGone = r.removeContainer(c)
		}
		r.closeEgress()
		r.cs.end(r, final)
		r.dropWorkspace()
	})
}

// lost ends this delivery's part in a run whose state changed under it: a
// cancel finalised it, or a later delivery claimed it. The container, if
// any, is stopped, then the run's resources released; the request is acked
// only when the run is final (nothing is left to do), and otherwise left to
// the delivery that holds it.
func (r *run) lost(ctx context.Context, out *outputPublisher) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.w.cfg.StopGrace+30*time.Second)
	defer cancel()
	if c := r.currentContainer(); c != nil {
		_, _ = r.stopAndWait(c)
	}
	r.release(r.state.State.Final())
	if out != nil {
		_, _ = out.close(ctx)
	}
	prev, _, err := r.w.store.load(ctx, r.req.ID)
	if err == nil && prev.State.Final() {
		r.log.Info().Str("state", string(prev.State)).Msg("run was finalised elsewhere (cancelled?); acking")
		r.ack()
		return
	}
	r.log.Warn().Str("holder", prev.Worker).Int("holder_attempt", prev.Attempts).
		Msg("lease lost: another delivery holds the run; stopping without recording anything")
}

// stopAndWait stops c with the worker's grace period and waits for its exit.
func (r *run) stopAndWait(c Container) (ExitStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), r.w.cfg.StopGrace+30*time.Second)
	defer cancel()
	if err := c.Stop(ctx, r.w.cfg.StopGrace); err != nil {
		return ExitStatus{Code: -1}, err
	}
	return c.Wait(ctx)
}

// handBack releases the run's resources (its container already stopped),
// records it queued again with reason and hands the request back (Nak), for
// a worker that is shutting down.
func (r *run) handBack(ctx context.Context, reason string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.w.cfg.StopGrace+30*time.Second)
	defer cancel()
	r.release(false)
	r.state.ContainerID = ""
	r.state.ExitCode = nil
	if err := r.toQueued(ctx, reason); err != nil {
		if errors.Is(err, errFenced) {
			r.log.Info().Msg("run no longer ours; not handing it back")
			return
		}
		r.log.Warn().Err(err).Msg("record handed-back state")
	}
	if err := r.msg.Nak(); err != nil {
		r.log.Warn().Err(err).Msg("nak on shutdown")
	}
	r.log.Info().Msg("run handed back on shutdown")
}

// removeContainer removes c and reports whether it did, logging a failure
// (the reconciler retries).
func (r *run) removeContainer(c Container) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Remove(ctx); err != nil {
		r.log.Warn().Err(err).Str("container_id", shortID(c.ID())).Msg("remove container; the reconciler will retry")
		return false
	}
	return true
}
