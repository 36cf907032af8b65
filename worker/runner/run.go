package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/live"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/runstate"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// run is one delivery of one request being handled.
type run struct {
	e    *Runner
	msg  jetstream.Msg
	meta *jetstream.MsgMetadata
	req  messages.RunRequest
	log  zerolog.Logger
	// idDerived is set when the request's body names no id: req.ID was
	// derived from the message (runstate.DeriveRunID), and another message
	// with the same body gets another.
	idDerived bool
	// operatorReplay is set when the request arrived on its pool's replay
	// subject (messages.SubjectReplay), which only operators may publish
	// to.
	operatorReplay bool
	// rec is the run's record as this delivery holds it.
	rec record
	// sr is the run as its stages see it, and stages its list; both set
	// by prepare.
	sr     *stage.Run
	stages []stage.Stage
	// mask masks the run's secrets in what it shows (the secrets stage's);
	// nil masks nothing.
	mask stage.Masker
	// ctl is the run's container and the stop asked for it.
	ctl control
	// cancelled is set when a cancel request reached the run.
	cancelled atomic.Bool
	// startCommitted is set, under the registry's lock, once the run's
	// container may start: a cancel then stops it rather than preventing
	// it (cancel.go).
	startCommitted bool
	// releaseOnce makes release give up the run's resources once.
	releaseOnce sync.Once
	// startReached is set once prepare succeeded: from then on the run
	// may have a container (made by its start, or handed), which release
	// may fail to remove.
	startReached bool
	// stopFailed is set by supervise when stopping the run's container
	// failed: it may still run, so its workspace is not captured.
	stopFailed bool
	// startedStored is closed once the started event is stored (or its
	// publish failed for good); nil before publishStarted.
	startedStored chan struct{}
	// place is where the run's container comes from: acquired by
	// prepare, before the stages are built (placement.go).
	place placement
	// prevContainer is the container id the run's record named when this
	// delivery read it: an earlier delivery's, removed before this one
	// starts its own.
	prevContainer string
	// adoptedFrom is the worker this run was adopted from ("" for a run
	// this worker started), gap how long no worker watched it (adopt.go).
	adoptedFrom string
	gap         time.Duration
	// replaying is set while an adopted run's parser is fed the output the
	// worker it was adopted from published: what the parser then finds
	// was published and acted on already.
	replaying atomic.Bool
}

// execute runs a claimed request in four steps: prepare (plan, spec,
// receipt, the stages' Prestart), start (the container, the stages'
// Poststart, the running state), supervise (wait, timeout, cancel and the
// stages' checks, down to plain exit facts) and conclude (classify the
// facts, the stages' Exited, then record). A step that fails records the
// outcome through abort. What the run holds is given up by release; the
// deferred call is only a safety net for paths that ended without
// recording (the run state changed under this delivery).
func (r *run) execute(ctx context.Context, prof *profile.Profile) {
	defer r.waitStarted()
	defer func() { r.release(r.rec.st.State.Final()) }()
	defer r.e.live.untrack(r)
	p, err := r.prepare(ctx, prof)
	if err != nil {
		r.abort(ctx, err)
		return
	}
	r.startReached = true
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
	prof *profile.Profile
	spec jail.ContainerSpec
}

// started is a run's live container and the readers of its output.
type started struct {
	c      jail.Container
	out    *outputPublisher
	parser *profile.Parser
}

// errRecorded is returned by a step that has already recorded the run's
// outcome (or found it no longer this delivery's to record): abort does
// nothing more.
var errRecorded = errors.New("outcome already recorded")

// abort records the outcome of a step's error: nothing for errRecorded, a
// retry for a stage.TransientError, the run failed for any other error (its
// text is the reason).
func (r *run) abort(ctx context.Context, err error) {
	var te stage.TransientError
	switch {
	case errors.Is(err, errRecorded):
	case errors.As(err, &te):
		r.retry(ctx, te.Err)
	default:
		r.fail(ctx, err.Error(), nil)
	}
}

// runTimeout is the bound of a run: the request's timeout, else the
// profile's, else the worker's default.
func runTimeout(req messages.RunRequest, prof *profile.Profile, def time.Duration) time.Duration {
	if req.Timeout != 0 {
		return time.Duration(req.Timeout)
	}
	if t := prof.TimeoutDuration(); t != 0 {
		return t
	}
	return def
}

// prepare plans the agent's command line, builds the container spec and
// the receipt, builds the run's stage list and calls each Prestarter,
// merging what it adds into the spec. Every outcome carries the receipt, a
// failure here included: it describes the plan until the spec exists.
func (r *run) prepare(ctx context.Context, prof *profile.Profile) (p prepared, err error) {
	e := r.e
	attempt := int(r.meta.NumDelivered)
	if attempt > 1 {
		// An earlier delivery's container belongs to a worker that lost the
		// run (it died or missed AckWait): remove it before starting ours so
		// two containers of one run never overlap.
		if err := e.RemoveRunContainers(ctx, r.req.ID, r.prevContainer); err != nil {
			return prepared{}, stage.Transient(fmt.Errorf("remove earlier containers: %w", err))
		}
	}
	p = prepared{prof: prof}
	timeout := runTimeout(r.req, prof, e.cfg.DefaultTimeout)
	r.rec.st.Coordination = "off"
	plan, err := prof.Plan(r.req.Prompt, prof.CoordinationOn())
	digest := e.digest(prof)
	// The receipt describes the plan until the spec exists, then the spec
	// and what the stages added so far (mounts, files): a run that fails
	// here carries it too.
	var adds receiptAdds
	defer func() {
		r.rec.st.Receipt = buildReceipt(prof, digest, plan, p.spec, adds, timeout, r.req.Prompt)
	}()
	if err != nil {
		return p, err
	}
	base := BuildSpec(SpecInput{
		Profile: prof, Request: r.req, Seq: r.meta.Sequence.Stream, Attempt: attempt, WorkerID: e.cfg.WorkerID,
		Install: e.cfg.Install, Now: time.Now(), Plan: plan,
	})
	r.place = acquire(e.cfg.Warm, prof, r.req.Workspace != nil, r.log)
	r.sr = &stage.Run{Request: r.req, Profile: prof, Plan: plan, Seq: r.meta.Sequence.Stream, Attempt: attempt,
		Timeout: timeout, Labels: base.Labels, Progress: &stage.Progress{}, Holds: e.cfg.Live.For(live.Run(r.req.ID)), Log: r.log, Failpoint: e.cfg.Failpoint,
		Placement: r.place.st}
	r.stages = e.stagesFor(r.sr)
	r.rec.noters = r.rec.noters[:0]
	for _, s := range r.stages {
		if n, ok := s.(stage.Noter); ok {
			r.rec.noters = append(r.rec.noters, n)
		}
	}
	p.spec = base
	p.spec.Env = slices.Clip(p.spec.Env)
	var dir stage.Dir
	for _, s := range r.stages {
		ps, ok := s.(stage.Prestarter)
		if !ok {
			continue
		}
		var resp stage.PrestartResponse
		if err := ps.Prestart(ctx, &stage.PrestartRequest{Run: r.sr, Spec: &base, Dir: dir, Mask: r.mask}, &resp); err != nil {
			return p, err
		}
		merge(&p.spec, &adds, &resp)
		if resp.Resume != "" {
			// The container's command resumes; the stages' Run keeps
			// the plan it was built with (stage.Run.Plan).
			if plan, err = resumePlan(prof, plan, &p.spec, resp.Resume); err != nil {
				return p, err
			}
		}
		if resp.Dir != nil {
			dir = resp.Dir
		}
		if resp.Mask != nil {
			r.mask = resp.Mask
		}
	}
	// A warm container must be the one a cold start would create, but
	// for what a hand-off binds late, from the image the profile names
	// now; else it goes, unused.
	r.place.verify(ctx, p.spec)
	return p, nil
}

// start starts the container with its output wired to the output events,
// the agent parser and the progress clock, calls each Poststarter,
// records the running state and publishes the started event.
func (r *run) start(ctx context.Context, p prepared) (started, error) {
	e := r.e
	prog := r.sr.Progress
	prog.Touch()
	s := started{
		parser: newParser(r, p.prof.Backend),
		out:    newOutputPublisher(e.cfg.JS, r.req.ID, r.meta.Sequence.Stream, int(r.meta.NumDelivered)),
	}
	s.out.budget = p.prof.MaxOutputBytes()
	s.out.mask, s.out.onStdout = r.mask, s.parser.Feed // the parser sees masked output
	output := func(stream string, b []byte) {
		prog.Touch()
		s.out.write(stream, b)
	}
	if !r.commitStart(ctx) {
		_, _ = s.out.close(ctx)
		return s, errRecorded
	}
	c, warmed, err := r.place.start(ctx, e.cfg.Runtime, p.spec, output, r.rec.nameContainer)
	switch {
	case isNameWarm(err) && errors.Is(err, runstate.ErrFenced):
		r.lost(ctx, s.out)
		return s, errRecorded
	case isNameWarm(err):
		_, _ = s.out.close(ctx)
		return s, stage.Transient(err)
	case warmed:
		r.rec.st.Warm = true
		r.rec.st.Receipt.Warm = true
	}
	if err != nil {
		_, _ = s.out.close(ctx)
		if r.cancelledBeforeStart(ctx) {
			return s, errRecorded
		}
		if errors.Is(err, jail.ErrPermanent) {
			return s, err
		}
		return s, stage.Transient(fmt.Errorf("start container: %w", err))
	}
	s.c = c
	r.rec.st.Receipt.ImageID = c.ImageID()
	perr := r.poststart(ctx, c)
	r.ctl.set(c)
	r.place.release(ctx) // the run holds its container now
	if perr != nil {
		// The run's container waits (in exec, for a workspace), nothing
		// unpacked: release removes it.
		_, _ = s.out.close(ctx)
		if r.cancelledBeforeStart(ctx) {
			return s, errRecorded
		}
		return s, perr
	}
	if r.startedCancelled(c) {
		r.ctl.stopAsync(c)
	}
	e.cfg.Failpoint(stage.FailpointAfterStart)
	e.cfg.Metrics.started.Inc()
	e.cfg.Metrics.queueWait.Observe(time.Since(r.meta.Timestamp).Seconds())
	if err := r.rec.toRunning(ctx, c.ID()); err != nil {
		if errors.Is(err, runstate.ErrFenced) {
			r.lost(ctx, s.out)
			return s, errRecorded
		}
		r.log.Warn().Err(err).Msg("record running state")
	}
	e.cfg.Failpoint(stage.FailpointRunning)
	r.publishStarted(ctx, c.ID(), s.out)
	r.log.Info().Str("container_id", shortID(c.ID())).Str("profile", p.prof.Name).Msg("run started")
	return s, nil
}

// resumePlan returns plan made to resume the agent CLI's session id
// (profile.Profile.Resume) and puts its container command in place of the
// old one at the end of spec.Cmd, after what stages prepended.
func resumePlan(prof *profile.Profile, plan profile.Plan, spec *jail.ContainerSpec, id string) (profile.Plan, error) {
	resumed, err := prof.Resume(plan, id)
	if err != nil {
		return plan, err
	}
	head := len(spec.Cmd) - len(plan.ContainerArgv())
	spec.Cmd = append(slices.Clip(spec.Cmd[:head]), resumed.ContainerArgv()...)
	return resumed, nil
}

// poststart calls each Poststarter with the started container c, and
// returns the first error.
func (r *run) poststart(ctx context.Context, c jail.Container) error {
	for _, s := range r.stages {
		if ps, ok := s.(stage.Poststarter); ok {
			if err := ps.Poststart(ctx, &stage.PoststartRequest{Run: r.sr, Container: c, Cancelled: r.cancelled.Load}); err != nil {
				return err
			}
		}
	}
	return nil
}

// newParser returns the parser of the run's agent CLI output for backend,
// its findings passed to the run.
func newParser(r *run, backend string) *profile.Parser {
	p := profile.NewParser(backend, r.agentEvent, r.onMCPStatus)
	p.OnFirstAnswer(r.onFirstAnswer)
	return p
}

// onMCPStatus passes the agent CLI's report of the jetcrew MCP server's
// status to the stages that watch it; a stop one asks for stops the run.
func (r *run) onMCPStatus(status string) {
	if r.replaying.Load() {
		return
	}
	for _, s := range r.stages {
		if o, ok := s.(stage.MCPObserver); ok {
			if stop := o.MCPStatus(status); stop != nil {
				r.ctl.stopFor(*stop)
			}
		}
	}
}

// onFirstAnswer passes the agent CLI's first answer from its model to the
// stages that watch it; a stop one asks for stops the run.
func (r *run) onFirstAnswer(a profile.Answer) {
	if r.replaying.Load() {
		return
	}
	for _, s := range r.stages {
		if o, ok := s.(stage.AnswerObserver); ok {
			if stop := o.FirstAnswer(a); stop != nil {
				r.ctl.stopFor(*stop)
			}
		}
	}
}

// supervise waits for the container's end (bounded by the run's timeout),
// with the stages' checks on, and stops the container when a cancel, a
// stage, the timeout or a worker shutdown ended the wait. It returns the
// exit facts, the output closed; it records nothing.
func (r *run) supervise(ctx context.Context, p prepared, s started) exitFacts {
	// The stall clock starts with the checks, once the container runs: a
	// container the engine was slow to create or start (seconds under
	// load) has not been idle meanwhile.
	r.sr.Progress.Touch()
	stopWatch := r.watch()
	// The timeout counts from the container's start as recorded: an
	// adopted run keeps the deadline it started with.
	begun := r.rec.st.StartedAt
	if begun.IsZero() {
		begun = time.Now()
	}
	waitCtx, cancelWait := context.WithDeadline(ctx, begun.Add(r.sr.Timeout))
	status, err := s.c.Wait(waitCtx)
	cancelWait()
	stopWatch()
	r.e.cfg.Failpoint(stage.FailpointAfterExit)
	f := exitFacts{Cancelled: r.cancelled.Load(), Timeout: r.sr.Timeout, Stop: r.ctl.stopped()}
	switch {
	case err == nil:
	case f.Cancelled || f.Stop != nil:
		// A cancel request or a stage stopped the container (SIGTERM,
		// grace, SIGKILL); wait for that to finish.
		if status, err = r.ctl.stopAndWait(s.c); err != nil {
			r.log.Warn().Err(err).Msg("stop container")
			r.stopFailed = true
		}
	case ctx.Err() != nil && r.e.leaving.Load():
		// The worker stops leaving its runs to a successor: the
		// container runs on, its output no longer read here.
		f.Shutdown, f.Left = true, true
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if err := s.c.Detach(dctx); err != nil {
			r.log.Warn().Err(err).Msg("detach from the container left running")
		}
		cancel()
	case ctx.Err() != nil:
		// The worker is shutting down hard.
		f.Shutdown = true
		_, _ = r.ctl.stopAndWait(s.c)
	case errors.Is(err, context.DeadlineExceeded):
		f.TimedOut = true
		if status, err = r.ctl.stopAndWait(s.c); err != nil {
			r.log.Warn().Err(err).Msg("stop timed-out container")
			r.stopFailed = true
		}
	default:
		f.WaitErr = err
	}
	f.Status = status
	f.Result, f.Summary = s.parser.Outcome()
	f.LastErr = s.out.lastErrLine()
	s.out.left.Store(f.Left)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*runstate.OpMaxElapsed)
	defer cancel()
	f.OutputBytes, f.OutputErr = s.out.close(cctx)
	s.out.noteDropped(&r.rec.st, r.log)
	return f
}

// conclude classifies the exit facts, lets the stages see the exit and
// amend the outcome (Exited, in list order), and records the outcome: a
// final state, a retry, or a hand-back on shutdown.
func (r *run) conclude(ctx context.Context, p prepared, f exitFacts) {
	o := classify(f, outcomePolicy{
		Attempt: int(r.meta.NumDelivered), Retries: p.prof.Retries, WorkerID: r.e.cfg.WorkerID, Spec: p.spec,
	})
	if f.WaitErr == nil && !f.Shutdown {
		st := &r.rec.st
		st.Result, st.Agent = clipResult(f.Result), f.Summary
		st.ExitCode = &f.Status.Code
		st.OOMKilled = f.Status.OOMKilled
		st.OutputBytes = f.OutputBytes
		if f.OutputErr != nil {
			r.log.Warn().Err(f.OutputErr).Msg("some output events were not acknowledged")
		}
		o = r.exited(ctx, o, f)
	}
	switch {
	case f.Left:
		departure{r}.leave(ctx)
		return
	case o.Action == actionHandBack:
		r.handBack(ctx, o.Reason)
	case o.Action == actionRetry:
		// The container is gone with the retry: the next delivery starts
		// its own.
		r.rec.st.ContainerID = ""
		r.retry(ctx, errors.New(o.Reason))
	default:
		r.finish(ctx, o.State, o.Reason)
	}
}

// exited lets each Exiter see the exit facts f and the outcome o as the
// ones before it left it, and returns o as they amended it.
func (r *run) exited(ctx context.Context, o outcome, f exitFacts) outcome {
	for _, s := range r.stages {
		if ex, ok := s.(stage.Exiter); ok {
			var resp stage.ExitedResponse
			ex.Exited(ctx, &stage.ExitedRequest{Run: r.sr, Final: o.Action == actionFinal, State: o.State, Reason: o.Reason,
				Status: f.Status, LastErr: f.LastErr, NotRun: o.NotRun, StopFailed: r.stopFailed, Stopped: f.stopped()}, &resp)
			o = o.amend(resp)
		}
	}
	return o
}

// release gives up what the run holds, once: its container (removed), then
// each stage's Release in reverse list order. The caller records the state
// first and removes the request from the stream after.
func (r *run) release(final bool) {
	r.releaseOnce.Do(func() {
		r.place.release(context.Background())
		// A container never made is gone: the run's start was never
		// reached and it claimed no warm container (whose removal may have
		// failed).
		gone := !r.startReached && (r.sr == nil || !r.sr.Placement.Warm())
		if c := r.ctl.current(); c != nil {
			gone = r.ctl.remove(c)
		}
		req := stage.ReleaseRequest{Run: r.sr, Final: final, ContainerGone: gone}
		for _, s := range slices.Backward(r.stages) {
			if rel, ok := s.(stage.Releaser); ok {
				rel.Release(&req)
			}
		}
	})
}

// lost ends this delivery's part in a run whose state changed under it: a
// cancel finalised it, or a later delivery claimed it. The container, if
// any, is stopped, then the run's resources released; the request is acked
// only when the run is final (nothing is left to do), and otherwise left to
// the delivery that holds it.
func (r *run) lost(ctx context.Context, out *outputPublisher) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.e.cfg.StopGrace+30*time.Second)
	defer cancel()
	if prev, _, err := r.e.cfg.Store.Load(ctx, r.req.ID); err == nil && (departure{r}).adoptedAway(prev) {
		departure{r}.leaveToAdopter(ctx, out, prev.Worker)
		return
	}
	if c := r.ctl.current(); c != nil {
		_, _ = r.ctl.stopAndWait(c)
	}
	r.release(r.rec.st.State.Final())
	if out != nil {
		_, _ = out.close(ctx)
	}
	prev, _, err := r.e.cfg.Store.Load(ctx, r.req.ID)
	if err == nil && prev.State.Final() {
		r.log.Info().Str("state", string(prev.State)).Msg("run was finalised elsewhere (cancelled?); acking")
		r.ack()
		return
	}
	r.log.Warn().Str("holder", prev.Worker).Int("holder_attempt", prev.Attempts).
		Msg("lease lost: another delivery holds the run; stopping without recording anything")
}

// handBack releases the run's resources (its container already stopped),
// records it queued again with reason and hands the request back (Nak), for
// a worker that is shutting down.
func (r *run) handBack(ctx context.Context, reason string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.e.cfg.StopGrace+30*time.Second)
	defer cancel()
	r.release(false)
	r.rec.st.ContainerID = ""
	r.rec.st.ExitCode = nil
	if err := r.rec.toQueued(ctx, reason); err != nil {
		if errors.Is(err, runstate.ErrFenced) {
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
