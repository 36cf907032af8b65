package worker

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
)

// DeriveRunID returns the run id of a request that carries none, derived from
// the stream message itself: a ULID whose time is the message's stream
// timestamp and whose entropy is its stream sequence. Every redelivery of the
// message, to any worker, yields the same id.
func DeriveRunID(meta *jetstream.MsgMetadata) string {
	var entropy [10]byte
	binary.BigEndian.PutUint64(entropy[2:], meta.Sequence.Stream)
	id, err := ulid.New(ulid.Timestamp(meta.Timestamp), bytesReader(entropy[:]))
	if err != nil {
		// Only a timestamp beyond the year 10889 fails.
		return "seq-" + strconv.FormatUint(meta.Sequence.Stream, 10)
	}
	return id.String()
}

type bytesReader []byte

func (b bytesReader) Read(p []byte) (int, error) { return copy(p, b), nil }

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
	// ws is the delivery's staged workspace, when the request names one.
	ws *runWorkspace
	// cleanup, when set, removes the run's container, session and
	// directory; finish calls it before removing the request.
	cleanup func()
	// stopKind and stopReason say which watchdog stopped the run.
	stopMu     sync.Mutex
	stopKind   string
	stopReason string
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

// handle runs one delivered request to an outcome: ack (final state
// recorded), term (dead letter recorded) or nak (handed back for a retry).
// It never panics the worker on bad input.
func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		w.log.Error().Err(err).Str("subject", msg.Subject()).Msg("message without JetStream metadata; terminating it")
		_ = msg.Term()
		return
	}
	w.failpoint(FailpointAfterFetch)
	w.metrics.inFlight.Inc()
	defer w.metrics.inFlight.Dec()
	if meta.NumDelivered > 1 {
		w.metrics.redelivered.Inc()
	}
	r := &run{w: w, msg: msg, meta: meta}
	pool, _ := messages.PoolFromSubject(msg.Subject())
	// A request that names no pool belongs to the pool it was published to.
	req, decErr := messages.DecodeRunRequestInPool(msg.Data(), pool)
	if decErr != nil {
		req = messages.RunRequest{ID: salvageID(msg.Data())}
	}
	if req.ID == "" {
		req.ID = DeriveRunID(meta)
	}
	r.req = req
	r.state = messages.RunState{
		Version:   messages.StateVersion,
		ID:        req.ID,
		State:     messages.StateQueued,
		Profile:   req.Profile,
		Pool:      pool,
		Group:     req.GroupOrID(),
		Worker:    w.cfg.ID,
		Attempts:  int(meta.NumDelivered),
		StreamSeq: meta.Sequence.Stream,
		Labels:    req.Labels,
		QueuedAt:  meta.Timestamp.UTC(),
	}
	r.log = w.log.With().Str("run_id", req.ID).Uint64("attempt", meta.NumDelivered).Logger()
	// Keep the delivery alive for as long as we hold it, from before the
	// first state read until the outcome is recorded, so a slow key-value
	// write (a leader election, say) never lets AckWait hand the request to
	// a second worker while this one still acts on it.
	stopProgress := r.keepInProgress()
	defer stopProgress()

	// Idempotency by run id and stream sequence; see decide.
	prev, rev, err := w.loadState(ctx, req.ID)
	if err != nil && !isNotFound(err) {
		r.retry(ctx, fmt.Errorf("read run state: %w", err))
		return
	}
	if err == nil {
		v := r.decide(prev)
		if (v == verdictAck || v == verdictRedeadLetter) && meta.NumDelivered > 1 {
			// The delivery that recorded the outcome died before removing
			// the request; remove its container too.
			if err := w.removeRunContainers(ctx, req.ID); err != nil {
				r.log.Warn().Err(err).Msg("remove the finished run's containers; the reconciler will retry")
			}
		}
		switch v {
		case verdictAck:
			r.log.Info().Str("state", string(prev.State)).Msg("run already final; acking without running")
			if prev.StreamSeq == meta.Sequence.Stream {
				// The delivery that recorded the outcome may have died
				// before its finished event: publish it (deduplicated).
				r.state = prev
				r.publishFinished(ctx)
			}
			r.ack()
			return
		case verdictRedeadLetter:
			// Redelivered after its final state was recorded but before the
			// dead letter was acknowledged: publish it again (deduplicated by
			// its message id) and remove the request.
			r.state = prev
			r.finishRemoval(ctx)
			return
		case verdictDuplicate:
			r.refuseDuplicate(ctx, prev)
			return
		case verdictReplay:
			r.state.Replays = prev.Replays + 1
			if prev.CancelPending {
				// Cancelled while this replay was queued: skip it.
				r.rev = rev
				r.state.QueuedAt = meta.Timestamp.UTC()
				r.finish(ctx, messages.StateCancelled, "cancelled while queued (a replay)")
				return
			}
		default:
			// A redelivery (or the submitter's record): the same request,
			// so a replay stays counted.
			r.state.Replays = prev.Replays
		}
		r.state.QueuedAt = prev.QueuedAt
		if r.state.QueuedAt.IsZero() {
			r.state.QueuedAt = meta.Timestamp.UTC()
		}
	}
	// Claim the run: this write, checked against the revision just read, is
	// the lease. Every later write checks the revision this one returns, so
	// a worker that lost the run (another delivery claimed it, or a cancel
	// finalised it) can no longer record anything.
	r.rev = rev
	if err := r.putState(ctx); err != nil {
		if errors.Is(err, errFenced) {
			r.log.Info().Msg("state changed while claiming the run; handing the request back to decide again")
			_ = msg.NakWithDelay(100 * time.Millisecond)
			return
		}
		r.retry(ctx, fmt.Errorf("claim run: %w", err))
		return
	}

	if decErr != nil {
		r.fail(ctx, decErr.Error(), nil)
		return
	}
	if req.Pool != pool {
		r.fail(ctx, fmt.Sprintf("request names pool %q but was published to %s", req.Pool, msg.Subject()), nil)
		return
	}
	prof, ok := w.cfg.Profiles[req.Profile]
	if !ok {
		r.fail(ctx, fmt.Sprintf("unknown profile %q (this worker has: %v)", req.Profile, w.cfg.Profiles.Names()), nil)
		return
	}
	r.execute(ctx, prof)
}

// verdict is what handle does with a request whose run id has a state.
type verdict int

const (
	verdictRun          verdict = iota // claim and run it
	verdictAck                         // already final for this message: ack
	verdictRedeadLetter                // final, unsuccessful, dead letter maybe missing
	verdictDuplicate                   // another message of the same run id: refuse
	verdictReplay                      // a finished, unsuccessful run submitted again: run anew
)

// decide compares this message with the run's recorded state:
//   - the state belongs to this very message (same stream sequence): a
//     redelivery. Final: ack (re-publishing the dead letter first when the
//     run did not succeed). Not final: run it.
//   - the state was written before any worker saw a message (sequence 0,
//     by the dispatcher or a cancel): run it, or ack when already final
//     (cancelled while queued).
//   - the state belongs to another message: a duplicate submit. Refused when
//     that run succeeded or is still queued or running; run anew (a replay)
//     when it failed, timed out or was cancelled.
func (r *run) decide(prev messages.RunState) verdict {
	seq := r.meta.Sequence.Stream
	switch {
	case prev.StreamSeq == seq && (prev.State == messages.StateFailed || prev.State == messages.StateTimedOut || prev.State == messages.StateStalled):
		return verdictRedeadLetter
	case prev.StreamSeq == seq && prev.State.Final():
		return verdictAck
	case prev.StreamSeq == seq:
		return verdictRun
	case prev.StreamSeq == 0 && prev.State.Final():
		return verdictAck
	case prev.StreamSeq == 0:
		return verdictRun
	case prev.State == messages.StateSucceeded || !prev.State.Final():
		return verdictDuplicate
	default:
		return verdictReplay
	}
}

// refuseDuplicate acks a second request for a run id without running it,
// and says so on the run's events and in the log.
func (r *run) refuseDuplicate(ctx context.Context, prev messages.RunState) {
	reason := fmt.Sprintf("duplicate request refused: run %s is already %s (request stream sequence %d, this one %d)",
		r.req.ID, prev.State, prev.StreamSeq, r.meta.Sequence.Stream)
	r.log.Warn().Str("state", string(prev.State)).Msg(reason)
	r.event(ctx, messages.Event{Type: messages.EventDuplicate, State: prev.State, Reason: reason})
	r.ack()
}

// salvageID returns the id field of an invalid request when it is a valid
// token, so the failure is recorded under the id the client chose.
func salvageID(data []byte) string {
	var v struct {
		ID string `json:"id"`
	}
	if len(data) > messages.MaxRequestBytes || json.Unmarshal(data, &v) != nil {
		return ""
	}
	if messages.ValidateToken("id", v.ID) != nil {
		return ""
	}
	return v.ID
}

// loadState returns the recorded state of run id and its revision in the
// bucket.
func (w *Worker) loadState(ctx context.Context, id string) (messages.RunState, uint64, error) {
	var st messages.RunState
	e, err := w.runs.Get(ctx, id)
	if err != nil {
		return st, 0, err
	}
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		return st, 0, fmt.Errorf("decode state of %s: %w", id, err)
	}
	return st, e.Revision(), nil
}

// execute starts the container and follows it to its end.
func (r *run) execute(ctx context.Context, prof Profile) {
	w := r.w
	attempt := int(r.meta.NumDelivered)

	if attempt > 1 {
		// An earlier delivery's container belongs to a worker that lost the
		// run (it died or missed AckWait): remove it before starting ours so
		// two containers of one run never overlap.
		if err := w.removeRunContainers(ctx, r.req.ID); err != nil {
			r.retry(ctx, fmt.Errorf("remove earlier containers: %w", err))
			return
		}
	}

	in := SpecInput{
		Profile: prof, Request: r.req, Seq: r.meta.Sequence.Stream, Attempt: attempt, WorkerID: w.cfg.ID, Install: w.install,
		Now: time.Now(), LookupEnv: w.cfg.LookupEnv,
	}
	timeout := time.Duration(r.req.Timeout)
	if timeout == 0 {
		timeout = prof.timeout
	}
	if timeout == 0 {
		timeout = w.cfg.DefaultTimeout
	}
	r.state.Coordination = "off"
	coordOn := prof.CoordinationOn()
	plan, err := planAgent(prof, r.req.Prompt, coordOn)
	// Every outcome carries the receipt, a failure before the agent
	// started included: here it describes the plan; below, the container.
	r.state.Receipt = buildReceipt(prof, plan, ContainerSpec{}, timeout, r.req.Prompt)
	if err != nil {
		r.fail(ctx, err.Error(), nil)
		return
	}
	in.Plan, in.Coordination = plan, coordOn
	needBridge := coordOn || plan.Launch
	if needBridge {
		in.BridgePath = w.cfg.BridgePath
	}
	if coordOn || len(plan.Files) > 0 {
		in.RunDir = w.runDir(r.req.ID)
	}
	spec, err := BuildSpec(in)
	if err != nil {
		r.fail(ctx, err.Error(), nil)
		return
	}
	if !r.stageWorkspace(ctx, &spec, prof) {
		return
	}
	defer r.dropWorkspace()
	r.state.Receipt = buildReceipt(prof, plan, spec, timeout, r.req.Prompt)
	if needBridge {
		if err := w.checkBridge(); err != nil {
			r.fail(ctx, err.Error(), nil)
			return
		}
	}
	var cs *coordSession
	if in.RunDir != "" {
		cs, err = r.stageRun(ctx, plan, coordOn)
		// The session ends with the delivery: for good when the run is
		// final, kept (detached) when it is handed back; the directory goes.
		defer func() { cs.end(r, r.state.State.Final()) }()
		if err != nil {
			r.fail(ctx, err.Error(), nil)
			return
		}
	}

	prog := &progress{}
	prog.touch()
	r.prog = prog
	parser := newAgentParser(prof.Backend, r.agentEvent, func(status string) {
		if status != "connected" {
			r.stopFor(stopBridge, fmt.Sprintf("the agent CLI reports MCP server %s as %q: it would work without coordination", coordination.MCPServerName, status))
			return
		}
		r.mcpProved.Store(true)
	})
	out := newOutputPublisher(w.js, r.req.ID, r.meta.Sequence.Stream, attempt)
	output := func(stream string, p []byte) {
		prog.touch()
		if stream == messages.StreamStdout {
			parser.feed(p)
		}
		out.write(stream, p)
	}
	c, err := w.cfg.Runtime.Start(ctx, spec, output)
	if err != nil {
		_, _ = out.close(ctx)
		if errors.Is(err, ErrPermanent) {
			r.fail(ctx, err.Error(), nil)
		} else {
			r.retry(ctx, fmt.Errorf("start container: %w", err))
		}
		return
	}
	if ider, ok := c.(interface{ ImageID() string }); ok {
		r.state.Receipt.ImageID = ider.ImageID()
	}
	r.setContainer(c)
	w.track(r, c)
	defer w.untrack(r.req.ID)
	w.failpoint(FailpointAfterStart)
	w.metrics.started.Inc()
	w.metrics.queueWait.Observe(time.Since(r.meta.Timestamp).Seconds())

	r.state.State = messages.StateRunning
	r.state.ContainerID = c.ID()
	r.state.StartedAt = time.Now().UTC()
	if err := r.putState(ctx); err != nil {
		if errors.Is(err, errFenced) {
			r.lost(ctx, c, out)
			return
		}
		r.log.Warn().Err(err).Msg("record running state")
	}
	w.failpoint(FailpointRunning)
	r.event(ctx, messages.Event{Type: messages.EventStarted, ContainerID: c.ID()})
	out.release()
	if cs != nil && cs.sess != nil {
		if err := cs.sess.SetState(ctx, messages.StateRunning); err != nil {
			r.log.Warn().Err(err).Msg("coordination presence")
		}
	}
	r.log.Info().Str("container_id", shortID(c.ID())).Str("profile", prof.Name).Msg("run started")

	needProof := prof.Backend != BackendCommand && coordOn
	stopWatch := r.watch(prof, needProof, cs, prog)
	waitCtx, cancelWait := context.WithTimeout(ctx, timeout)
	status, err := c.Wait(waitCtx)
	cancelWait()
	stopWatch()
	w.failpoint(FailpointAfterExit)
	final, reason := messages.StateSucceeded, ""
	stopKind, stopReason := r.stopped()
	switch {
	case r.cancelled.Load() || stopKind != stopNone:
		// A cancel request or a watchdog stopped the container (SIGTERM,
		// grace, SIGKILL); wait for that to finish.
		if err != nil {
			status, err = r.stopAndWait(c)
			if err != nil {
				r.log.Warn().Err(err).Msg("stop container")
			}
		}
	case err != nil && ctx.Err() != nil:
		// The worker is shutting down hard: stop the container and hand the
		// request back for another worker.
		r.abandon(c, out)
		return
	case err != nil && errors.Is(err, context.DeadlineExceeded):
		final, reason = messages.StateTimedOut, fmt.Sprintf("timed out after %s", timeout)
		status, err = r.stopAndWait(c)
		if err != nil {
			r.log.Warn().Err(err).Msg("stop timed-out container")
		}
	case err != nil:
		_, _ = out.close(ctx)
		r.removeContainer(c)
		r.retry(ctx, fmt.Errorf("wait for container: %w", err))
		return
	}
	result, summary := parser.outcome()
	r.state.Result, r.state.Agent = clipResult(result), summary
	r.state.ExitCode = &status.Code
	switch {
	case r.cancelled.Load():
		final, reason = messages.StateCancelled, "cancelled by request"
	case stopKind == stopStalled:
		final, reason = messages.StateStalled, stopReason
	case stopKind == stopBridge:
		final, reason = messages.StateFailed, stopReason
	case final != messages.StateSucceeded:
	case status.OOMKilled:
		final, reason = messages.StateFailed, "oom"
	case status.Code != 0 && summary != nil && summary.IsError && result != "":
		final, reason = messages.StateFailed, fmt.Sprintf("exit code %d: the agent reported: %s", status.Code, oneLine(result))
	case status.Code != 0:
		final, reason = messages.StateFailed, exitReason(status, out.lastErrLine(), spec)
	}
	n, perr := out.close(ctx)
	r.state.OutputBytes = n
	r.state.BridgeConnected = cs.connected()
	if perr != nil {
		r.log.Warn().Err(perr).Msg("some output events were not acknowledged")
	}
	if final == messages.StateFailed && status.Code != 0 && !status.OOMKilled && stopKind == stopNone &&
		attempt <= prof.Retries {
		// The profile asks for retries of a failed agent: hand the request
		// back (with backoff) instead of ending the run.
		r.removeContainer(c)
		r.state.ContainerID = ""
		r.retry(ctx, fmt.Errorf("%s (attempt %d; the profile allows %d retries)", reason, attempt, prof.Retries))
		return
	}
	reason = r.captureWorkspace(ctx, reason)
	r.cleanup = func() {
		r.removeContainer(c)
		cs.end(r, true)
	}
	r.finish(ctx, final, reason)
	r.removeContainer(c)
}

// Why a watchdog stopped a run.
const (
	stopNone    = ""
	stopStalled = "stalled"
	stopBridge  = "bridge"
)

// setContainer records the run's started container, and stops it at once
// when a watchdog asked for that while it was starting.
func (r *run) setContainer(c Container) {
	r.stopMu.Lock()
	r.container = c
	kind := r.stopKind
	r.stopMu.Unlock()
	if kind != stopNone {
		r.stopContainer(c)
	}
}

// stopFor stops the run's container, once, for a watchdog reason: the first
// reason wins. Called before the container is known, the stop happens as
// soon as it is.
func (r *run) stopFor(kind, reason string) {
	r.stopMu.Lock()
	if r.stopKind != stopNone {
		r.stopMu.Unlock()
		return
	}
	r.stopKind, r.stopReason = kind, reason
	c := r.container
	r.stopMu.Unlock()
	r.log.Warn().Str("why", kind).Msg(reason)
	if c != nil {
		r.stopContainer(c)
	}
}

func (r *run) stopContainer(c Container) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), r.w.cfg.StopGrace+30*time.Second)
		defer cancel()
		if err := c.Stop(ctx, r.w.cfg.StopGrace); err != nil {
			r.log.Warn().Err(err).Msg("stop container")
		}
	}()
}

func (r *run) stopped() (kind, reason string) {
	r.stopMu.Lock()
	defer r.stopMu.Unlock()
	return r.stopKind, r.stopReason
}

// watch runs the run's watchdogs until the returned function is called: the
// stall watchdog (no output and no coordination traffic for the profile's
// stall timeout) and, for agent CLIs with coordination on, the bridge
// deadline (the CLI must have started the jetcrew MCP server, proved by the
// bridge's first connection or by the CLI's own report, in time).
func (r *run) watch(prof Profile, needProof bool, cs *coordSession, prog *progress) func() {
	stop, done := make(chan struct{}), make(chan struct{})
	started := time.Now()
	go func() {
		defer close(done)
		t := time.NewTicker(watchInterval(prof))
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			if prof.stallTimeout > 0 && prog.since() > prof.stallTimeout {
				r.stopFor(stopStalled, fmt.Sprintf("no progress (no output, no coordination traffic) for %s", prof.stallTimeout))
			}
			if !r.state.BridgeConnected && cs.connected() {
				// Record it while the run lives, not only at its end. The run's
				// own goroutine is in Wait meanwhile, so this write is alone.
				r.state.BridgeConnected = true
				ctx, cancel := context.WithTimeout(context.Background(), opMaxElapsed)
				if err := r.putState(ctx); err != nil {
					r.log.Warn().Err(err).Msg("record bridge connected")
				}
				cancel()
			}
			if needProof && !r.mcpProved.Load() && !cs.connected() && time.Since(started) > prof.bridgeDeadline {
				r.stopFor(stopBridge, fmt.Sprintf("the agent did not start the %s MCP server within %s (its bridge never connected)", coordination.MCPServerName, prof.bridgeDeadline))
			}
		}
	}()
	return func() { close(stop); <-done }
}

// watchInterval is how often the watchdogs look: a tenth of the shortest
// bound, between 50ms and 1s.
func watchInterval(p Profile) time.Duration {
	d := time.Second
	for _, b := range []time.Duration{p.stallTimeout, p.bridgeDeadline} {
		if b > 0 && b/10 < d {
			d = b / 10
		}
	}
	return max(d, 50*time.Millisecond)
}

// maxResult bounds the result text kept in a run's state, in bytes.
const maxResult = 64 << 10

func clipResult(s string) string {
	if len(s) > maxResult {
		return s[:maxResult]
	}
	return s
}

// agentEvent publishes a step of the agent CLI's output on
// jetcrew.events.<run_id>.agent (a core publish, captured by the events
// stream; the raw bytes are in the output events).
func (r *run) agentEvent(ev messages.AgentEvent) {
	ev.RunID = r.req.ID
	b, err := json.Marshal(ev)
	if err != nil {
		return
	}
	m := nats.NewMsg(messages.SubjectEvents(r.req.ID, messages.EventAgent))
	m.Data = b
	m.Header.Set(messages.HeaderRunID, r.req.ID)
	_ = r.w.nc.PublishMsg(m)
}

// exitReason explains a non-zero exit: the code, a diagnosis when stderr
// shows a jail limit was hit, and the last line of stderr.
func exitReason(status ExitStatus, lastErr string, spec ContainerSpec) string {
	reason := fmt.Sprintf("exit code %d", status.Code)
	switch {
	case strings.Contains(lastErr, "No space left on device"):
		reason += fmt.Sprintf(" (no space left on device: a tmpfs is full; /tmp is %s)", spec.Tmpfs["/tmp"])
	case strings.Contains(lastErr, "can't fork"), strings.Contains(lastErr, "Resource temporarily unavailable"),
		strings.Contains(lastErr, "fork: retry"):
		reason += fmt.Sprintf(" (pids limit of %d reached: process creation failed)", spec.PidsLimit)
	}
	if status.Error != "" {
		reason += ": " + status.Error
	}
	if lastErr != "" {
		reason += ": " + lastErr
	}
	return reason
}

// lost ends this delivery's part in a run whose state changed under it: a
// cancel finalised it, or a later delivery claimed it. The container, if
// any, is stopped and removed; the request is acked only when the run is
// final (nothing is left to do), and otherwise left to the delivery that
// holds it.
func (r *run) lost(ctx context.Context, c Container, out *outputPublisher) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.w.cfg.StopGrace+30*time.Second)
	defer cancel()
	if c != nil {
		_, _ = r.stopAndWait(c)
		r.removeContainer(c)
	}
	if out != nil {
		_, _ = out.close(ctx)
	}
	prev, _, err := r.w.loadState(ctx, r.req.ID)
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

// abandon stops and removes c and hands the request back, for a worker that
// is shutting down.
func (r *run) abandon(c Container, out *outputPublisher) {
	ctx, cancel := context.WithTimeout(context.Background(), r.w.cfg.StopGrace+30*time.Second)
	defer cancel()
	_, _ = r.stopAndWait(c)
	_, _ = out.close(ctx)
	r.removeContainer(c)
	r.state.State = messages.StateQueued
	r.state.Reason = "handed back: worker " + r.w.cfg.ID + " shut down"
	r.state.ContainerID = ""
	r.state.ExitCode = nil
	if err := r.putState(ctx); err != nil {
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

func (r *run) removeContainer(c Container) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Remove(ctx); err != nil {
		r.log.Warn().Err(err).Str("container_id", shortID(c.ID())).Msg("remove container; the reconciler will retry")
	}
}

// keepInProgress sends InProgress every InProgressInterval until the
// returned function is called, so a run longer than AckWait is not
// redelivered.
func (r *run) keepInProgress() func() {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(r.w.cfg.InProgressInterval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if err := r.msg.InProgress(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
					r.log.Warn().Err(err).Msg("in-progress")
				}
			}
		}
	}()
	return func() { close(stop); <-done }
}

// finish records a final state and the finished event, then removes the
// request from the stream: ack for success, a dead letter then term for the
// rest. The dead letter is published, and its publish acknowledged, before
// the term, so a crash in between leaves the request to be redelivered and
// the dead letter deduplicated by its Nats-Msg-Id.
func (r *run) finish(ctx context.Context, final messages.State, reason string) {
	r.state.State = final
	r.state.Reason = reason
	r.state.FinishedAt = time.Now().UTC()

	// Recording the outcome must survive a worker shutdown that cancels ctx.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*opMaxElapsed)
	defer cancel()
	if err := r.putState(ctx); err != nil {
		if errors.Is(err, errFenced) {
			r.lost(ctx, nil, nil)
			return
		}
		r.retry(ctx, fmt.Errorf("record final state: %w", err))
		return
	}
	r.w.metrics.finished.WithLabelValues(string(final)).Inc()
	if !r.state.StartedAt.IsZero() {
		r.w.metrics.duration.Observe(r.state.FinishedAt.Sub(r.state.StartedAt).Seconds())
	}
	lg := r.log.Info()
	if final != messages.StateSucceeded {
		lg = r.log.Warn()
	}
	lg.Str("state", string(final)).Str("reason", reason).Msg("run finished")
	r.w.failpoint(FailpointAfterResult)
	// The dead letter is stored before the finished event, so whoever sees
	// the run finished can already replay it.
	deadLetter := final != messages.StateSucceeded && final != messages.StateCancelled
	if deadLetter {
		if err := r.deadLetter(ctx); err != nil {
			r.log.Error().Err(err).Msg("publish dead letter; leaving the request for redelivery")
			_ = r.msg.NakWithDelay(5 * time.Second)
			return
		}
		r.w.failpoint(FailpointAfterDeadLetter)
	}
	// The run's container, session and directory go before its finished
	// event and its request do, so a replay sent on seeing the event never
	// meets them.
	if r.cleanup != nil {
		r.cleanup()
	}
	r.publishFinished(ctx)
	if !deadLetter {
		r.ack()
		return
	}
	if err := r.msg.Term(); err != nil {
		r.log.Warn().Err(err).Msg("term")
	}
}

// publishFinished publishes the run's finished event from its recorded final
// state.
func (r *run) publishFinished(ctx context.Context) {
	r.event(ctx, messages.Event{
		Type: messages.EventFinished, State: r.state.State, ExitCode: r.state.ExitCode,
		Reason: r.state.Reason, ContainerID: r.state.ContainerID, Receipt: r.state.Receipt, Result: r.state.Result,
		WorkspaceResult: r.state.WorkspaceResult,
	})
}

// finishRemoval removes the request of a run whose final state is recorded:
// ack for success; for the rest, the dead letter is published (and its
// publish acknowledged) before the term.
func (r *run) finishRemoval(ctx context.Context) {
	if r.state.State == messages.StateSucceeded || r.state.State == messages.StateCancelled {
		r.ack()
		return
	}
	if err := r.deadLetter(ctx); err != nil {
		r.log.Error().Err(err).Msg("publish dead letter; leaving the request for redelivery")
		_ = r.msg.NakWithDelay(5 * time.Second)
		return
	}
	r.publishFinished(ctx)
	r.w.failpoint(FailpointAfterDeadLetter)
	if err := r.msg.Term(); err != nil {
		r.log.Warn().Err(err).Msg("term")
	}
}

// fail ends the run failed before or without a container, for a reason
// retrying cannot fix.
func (r *run) fail(ctx context.Context, reason string, exitCode *int) {
	r.state.ExitCode = exitCode
	r.finish(ctx, messages.StateFailed, reason)
}

// retry hands the request back with an exponential, jittered delay for an
// infrastructure failure, or fails the run when this was the last delivery.
func (r *run) retry(ctx context.Context, cause error) {
	attempt := int(r.meta.NumDelivered)
	if attempt >= r.w.cfg.Provision.MaxDeliver {
		r.fail(ctx, fmt.Sprintf("gave up after %d attempts: %v", attempt, cause), nil)
		return
	}
	delay := retryDelay(attempt)
	r.log.Warn().Err(cause).Dur("delay", delay).Msg("infrastructure failure; retrying")
	r.state.State = messages.StateQueued
	r.state.Reason = "retrying: " + cause.Error()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := r.putState(sctx); err != nil {
		if errors.Is(err, errFenced) {
			r.lost(sctx, nil, nil)
			return
		}
		r.log.Warn().Err(err).Msg("record retry state")
	}
	// NakWithDelay, not Nak: the consumer's BackOff applies only to ack
	// timeouts, never to a plain Nak.
	if err := r.msg.NakWithDelay(delay); err != nil {
		r.log.Warn().Err(err).Msg("nak")
	}
}

// retryDelay returns the delay before delivery attempt+1: exponential from
// 1s, doubling, with ±50% jitter, capped at 1 minute.
func retryDelay(attempt int) time.Duration {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = time.Second
	b.MaxInterval = time.Minute
	b.Multiplier = 2
	b.RandomizationFactor = 0.5
	b.MaxElapsedTime = 0
	d := b.NextBackOff()
	for i := 1; i < attempt; i++ {
		d = b.NextBackOff()
	}
	return d
}

func (r *run) ack() {
	ctx, cancel := context.WithTimeout(context.Background(), opMaxElapsed)
	defer cancel()
	// DoubleAck waits for the server to confirm, so a lost ack shows up here
	// instead of as a surprise redelivery.
	if err := retryOp(ctx, r.msg.DoubleAck); err != nil {
		r.log.Warn().Err(err).Msg("ack")
	}
}

// errFenced is returned by putState when the run's state changed since this
// delivery last wrote it: another delivery claimed the run, or a cancel
// finalised it. The delivery must then stop acting for the run.
var errFenced = errors.New("run state changed under this delivery (lease lost)")

// putState writes r.state only if the stored revision is still the one this
// delivery last wrote (or, for the first write, no state exists), and
// records the new revision.
//
// A try whose reply is lost is tried again; when the retry then conflicts,
// the stored record is read back, and if it is the very record this call
// wrote (the lost reply's write landed), the write counts as done.
func (r *run) putState(ctx context.Context) error {
	r.state.UpdatedAt = time.Now().UTC()
	b, err := json.Marshal(r.state)
	if err != nil {
		return err
	}
	tries := 0
	return retryOp(ctx, func(ctx context.Context) error {
		tries++
		var rev uint64
		var err error
		if r.rev == 0 {
			rev, err = r.w.runs.Create(ctx, r.state.ID, b)
		} else {
			rev, err = r.w.runs.Update(ctx, r.state.ID, b, r.rev)
		}
		if err == nil {
			r.rev = rev
			return nil
		}
		if !isRevisionConflict(err) {
			return err
		}
		if tries > 1 {
			if e, gerr := r.w.runs.Get(ctx, r.state.ID); gerr == nil && bytes.Equal(e.Value(), b) {
				r.rev = e.Revision()
				return nil
			} else if gerr != nil && !isNotFound(gerr) {
				return gerr
			}
		}
		return backoff.Permanent(errFenced)
	})
}

// event publishes a JSON event for the run and waits for its ack.
func (r *run) event(ctx context.Context, ev messages.Event) {
	ev.RunID = r.req.ID
	ev.Time = time.Now().UTC()
	ev.Attempt = int(r.meta.NumDelivered)
	ev.Worker = r.w.cfg.ID
	b, err := json.Marshal(ev)
	if err != nil {
		return
	}
	m := nats.NewMsg(messages.SubjectEvents(r.req.ID, ev.Type))
	m.Data = b
	m.Header.Set(messages.HeaderRunID, r.req.ID)
	m.Header.Set(messages.HeaderAttempt, strconv.Itoa(ev.Attempt))
	// One event of each type per request message and delivery: a retried
	// publish whose first reply was lost is deduplicated by the stream.
	msgID := fmt.Sprintf("ev-%s-%d-%d-%s", r.req.ID, r.meta.Sequence.Stream, ev.Attempt, ev.Type)
	if ev.Type == messages.EventFinished {
		// One finished event per request message, whichever delivery
		// publishes it (a redelivery re-publishes it after a crash).
		msgID = fmt.Sprintf("ev-%s-%d-finished", r.req.ID, r.meta.Sequence.Stream)
	}
	m.Header.Set(jetstream.MsgIDHeader, msgID)
	if err := retryOp(ctx, func(ctx context.Context) error { _, err := r.w.js.PublishMsg(ctx, m); return err }); err != nil {
		r.log.Warn().Err(err).Str("type", string(ev.Type)).Msg("publish event")
	}
}

// deadLetter copies the original request, byte for byte, to
// jetcrew.failed.<pool>.<run_id> with headers saying why, and waits for the
// server's ack.
func (r *run) deadLetter(ctx context.Context) error {
	m := deadLetterMsg(r.msg.Data(), r.state, r.meta.Sequence.Stream, r.w.cfg.ID)
	return retryOp(ctx, func(ctx context.Context) error { _, err := r.w.js.PublishMsg(ctx, m); return err })
}

// deadLetterMsg builds the dead letter of the request data (its body, byte
// for byte) at stream sequence seq, whose run ended as st: subject
// jetcrew.failed.<pool>.<run_id>, headers saying why, and a Nats-Msg-Id that
// makes it one dead letter per request message, however often a crash makes
// it published.
func deadLetterMsg(data []byte, st messages.RunState, seq uint64, workerID string) *nats.Msg {
	pool := st.Pool
	if pool == "" {
		pool = messages.DefaultPool
	}
	m := nats.NewMsg(messages.SubjectFailed(pool, st.ID))
	m.Data = data
	m.Header.Set(messages.HeaderRunID, st.ID)
	m.Header.Set(messages.HeaderError, oneLine(st.Reason))
	m.Header.Set(messages.HeaderState, string(st.State))
	m.Header.Set(messages.HeaderAttempts, strconv.Itoa(st.Attempts))
	m.Header.Set(messages.HeaderWorker, workerID)
	if st.ExitCode != nil {
		m.Header.Set(messages.HeaderExitCode, strconv.Itoa(*st.ExitCode))
	}
	if st.Receipt != nil {
		if b, err := json.Marshal(st.Receipt); err == nil {
			m.Header.Set(messages.HeaderReceipt, string(b))
		}
	}
	m.Header.Set(jetstream.MsgIDHeader, deadLetterMsgID(st.ID, seq))
	return m
}

func oneLine(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '\r' || c == '\n' {
			b[i] = ' '
		}
	}
	if len(b) > 1024 {
		b = b[:1024]
	}
	return string(b)
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func (w *Worker) track(r *run, c Container) {
	w.mu.Lock()
	w.active[r.req.ID] = &activeRun{run: r, container: c}
	w.mu.Unlock()
}

func (w *Worker) untrack(runID string) {
	w.mu.Lock()
	delete(w.active, runID)
	w.mu.Unlock()
}
