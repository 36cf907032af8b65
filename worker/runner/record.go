package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/cenkalti/backoff/v4"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/runstate"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/nats-io/nats.go"
)

// finish records a final state and the finished event, then removes the
// request from the stream: ack for success, a dead letter then term for the
// rest. The dead letter is published, and its publish acknowledged, before
// the term, so a crash in between leaves the request to be redelivered and
// the dead letter deduplicated by its Nats-Msg-Id.
func (r *run) finish(ctx context.Context, final messages.State, reason string) {
	reason = maskString(r.mask, reason)
	// Recording the outcome must survive a worker shutdown that cancels ctx.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*runstate.OpMaxElapsed)
	defer cancel()
	if err := r.rec.toFinal(ctx, final, reason); err != nil {
		if errors.Is(err, runstate.ErrFenced) {
			r.lost(ctx, nil)
			return
		}
		r.retry(ctx, fmt.Errorf("record final state: %w", err))
		return
	}
	r.e.cfg.Metrics.finished.WithLabelValues(string(final)).Inc()
	if !r.rec.st.StartedAt.IsZero() {
		r.e.cfg.Metrics.duration.Observe(r.rec.st.FinishedAt.Sub(r.rec.st.StartedAt).Seconds())
	}
	lg := r.log.Info()
	if final != messages.StateSucceeded {
		lg = r.log.Warn()
	}
	lg.Str("state", string(final)).Str("reason", reason).Msg("run finished")
	r.e.cfg.Failpoint(stage.FailpointAfterResult)
	// The dead letter is stored before the finished event, so whoever sees
	// the run finished can already replay it.
	deadLetter := final != messages.StateSucceeded && final != messages.StateCancelled
	if deadLetter {
		if err := r.deadLetter(ctx); err != nil {
			r.log.Error().Err(err).Msg("publish dead letter; leaving the request for redelivery")
			r.release(true)
			_ = r.msg.NakWithDelay(5 * time.Second)
			return
		}
		r.e.cfg.Failpoint(stage.FailpointAfterDeadLetter)
	}
	// The run's container, session and directory go before its finished
	// event and its request do, so a replay sent on seeing the event never
	// meets them.
	r.release(true)
	r.publishFinished(ctx)
	defer removeAdoptedRequest(ctx, r)
	if !deadLetter {
		r.ack()
		return
	}
	if err := r.msg.Term(); err != nil {
		r.log.Warn().Err(err).Msg("term")
	}
}

// publishFinished publishes the run's finished event from its recorded final
// state, after its started event.
func (r *run) publishFinished(ctx context.Context) {
	r.waitStarted()
	r.event(ctx, runstate.FinishedEvent(r.rec.st))
}

// finishRemoval removes the request of a run whose final state is recorded:
// ack for success; for the rest, the dead letter is published (and its
// publish acknowledged) before the term.
func (r *run) finishRemoval(ctx context.Context) {
	if r.rec.st.State == messages.StateSucceeded || r.rec.st.State == messages.StateCancelled {
		r.ack()
		return
	}
	if err := r.deadLetter(ctx); err != nil {
		r.log.Error().Err(err).Msg("publish dead letter; leaving the request for redelivery")
		_ = r.msg.NakWithDelay(5 * time.Second)
		return
	}
	r.publishFinished(ctx)
	r.e.cfg.Failpoint(stage.FailpointAfterDeadLetter)
	if err := r.msg.Term(); err != nil {
		r.log.Warn().Err(err).Msg("term")
	}
}

// fail ends the run failed before or without a container, for a reason
// retrying cannot fix.
func (r *run) fail(ctx context.Context, reason string, exitCode *int) {
	r.rec.st.ExitCode = exitCode
	r.finish(ctx, messages.StateFailed, reason)
}

// retry hands the request back with an exponential, jittered delay for an
// infrastructure failure, or fails the run when this was the last delivery.
func (r *run) retry(ctx context.Context, cause error) {
	cause = maskErr(r.mask, cause)
	attempt := int(r.meta.NumDelivered)
	if attempt >= r.e.cfg.MaxDeliver {
		r.fail(ctx, fmt.Sprintf("gave up after %d attempts: %v", attempt, cause), nil)
		return
	}
	delay := retryDelay(attempt)
	r.log.Warn().Err(cause).Dur("delay", delay).Msg("infrastructure failure; retrying")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	// The run's container, session (detached: the run goes on) and
	// directory go before the request is handed back.
	r.release(false)
	if err := r.rec.toQueued(sctx, "retrying: "+cause.Error()); err != nil {
		if errors.Is(err, runstate.ErrFenced) {
			r.lost(sctx, nil)
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

// ack removes the request of a run whose outcome is recorded (its final
// state, then its finished event, both acknowledged by the server) from the
// stream. It is a plain Ack, not a DoubleAck: waiting for the server's
// confirmation would hold the slot one more round trip per run and cost the
// server a reply, and an ack that is lost is safe: the request is delivered
// again after AckWait, that delivery finds the final state (decide's
// verdictAck) and acks it then, running nothing.
func (r *run) ack() {
	if err := r.msg.Ack(); err != nil {
		r.log.Warn().Err(err).Msg("ack")
	}
}

// event publishes a JSON event for the run and waits for its ack.
func (r *run) event(ctx context.Context, ev messages.Event) {
	if err := r.e.cfg.Store.Publish(ctx, r.eventMsg(ev)); err != nil {
		r.log.Warn().Err(err).Str("type", string(ev.Type)).Msg("publish event")
	}
}

// eventMsg stamps ev as this delivery's (run id, time, attempt, worker)
// and builds its message.
func (r *run) eventMsg(ev messages.Event) *nats.Msg {
	ev.RunID = r.req.ID
	ev.Time = time.Now().UTC()
	ev.Attempt = int(r.meta.NumDelivered)
	ev.Worker = r.e.cfg.WorkerID
	return runstate.EventMsg(ev, r.meta.Sequence.Stream)
}

// publishStarted publishes the started event of container id without
// waiting for the server's ack, so the run goes on meanwhile (one round
// trip less per run). What must follow the event still does: out holds
// the run's output until the event is stored (no output event precedes
// started, docs/wire.md), and the finished event waits for it
// (waitStarted). A publish that fails or gets no ack within
// runstate.OpAttemptTimeout is retried as event does (its Nats-Msg-Id deduplicates
// it); a failure for good is logged, and the output released all the same,
// as before.
func (r *run) publishStarted(ctx context.Context, containerID string, out *outputPublisher) {
	ev := messages.Event{Type: messages.EventStarted, ContainerID: containerID, Warm: r.rec.st.Warm}
	ev.Prompt, ev.PromptBytes = eventPrompt(r.req.Prompt, r.mask)
	m := r.eventMsg(ev)
	stored := make(chan struct{})
	r.startedStored = stored
	out.gate = stored
	f, err := r.e.cfg.JS.PublishMsgAsync(m)
	go func() {
		// Ends once the event is acknowledged, or retryOp gives up (ctx
		// ends or runstate.OpMaxElapsed passes).
		defer close(stored)
		defer out.release()
		if err == nil {
			select {
			case <-f.Ok():
				return
			case <-f.Err():
			}
		}
		if err := r.e.cfg.Store.Publish(ctx, m); err != nil {
			r.log.Warn().Err(err).Str("type", string(messages.EventStarted)).Msg("publish event")
		}
	}()
}

// eventPrompt returns prompt as the started event carries it: masked by
// mask (nil masks nothing: the run has no secret), then cut to at most
// messages.MaxEventPrompt bytes at a whole UTF-8 character, with the
// masked prompt's size when it was cut (else 0). Masked before it is cut,
// so a cut never leaves the start of a secret unmasked.
func eventPrompt(prompt string, mask stage.Masker) (string, int) {
	if mask != nil {
		prompt = mask.String(prompt)
	}
	if len(prompt) <= messages.MaxEventPrompt {
		return prompt, 0
	}
	cut := messages.MaxEventPrompt
	for cut > 0 && !utf8.RuneStart(prompt[cut]) {
		cut--
	}
	return prompt[:cut], len(prompt)
}

// waitStarted waits until the started event is stored (or its publish
// failed for good): every event after it is published after that.
func (r *run) waitStarted() {
	if r.startedStored != nil {
		<-r.startedStored
	}
}

// deadLetter copies the original request, byte for byte, to
// jetcrew.failed.<pool>.<run_id> with headers saying why, and waits for the
// server's ack.
func (r *run) deadLetter(ctx context.Context) error {
	m := runstate.DeadLetterMsg(r.msg.Data(), r.rec.st, r.meta.Sequence.Stream, r.e.cfg.WorkerID)
	runstate.CopySignature(m.Header, r.msg.Headers())
	return runstate.RetryOp(ctx, func(ctx context.Context) error { _, err := r.e.cfg.JS.PublishMsg(ctx, m); return err })
}

// agentEvent publishes a step of the agent CLI's output on
// jetcrew.events.<run_id>.agent (a core publish, captured by the events
// stream; the raw bytes are in the output events).
func (r *run) agentEvent(ev messages.AgentEvent) {
	if r.replaying.Load() {
		return // published by the worker the run was adopted from
	}
	ev.RunID = r.req.ID
	b, err := json.Marshal(ev)
	if err != nil {
		return
	}
	m := nats.NewMsg(messages.SubjectEvents(r.req.ID, messages.EventAgent))
	m.Data = b
	m.Header.Set(messages.HeaderRunID, r.req.ID)
	_ = r.e.cfg.NC.PublishMsg(m)
}

// record is a delivery's view of its run's record: the state it last wrote
// or read, the revision it holds (the lease) and the state it holds the run
// in. Every write goes through put: the stages note their parts, then the
// store compare-and-sets it.
type record struct {
	store *runstate.Store
	st    messages.RunState
	// rev is the bucket revision of the run's state as this delivery last
	// wrote it: the lease. 0 means no state exists yet.
	rev uint64
	// from is the state this delivery holds the run in: the origin of its
	// next transition (messages.StateNone before any record exists).
	from messages.State
	// noters are the run's stages that own part of the record.
	noters []stage.Noter
}

// put writes st as this delivery's next transition: from the state this
// delivery holds the run in to st.State, checked against the revision this
// delivery last wrote or read (the lease), after each noter wrote its part.
// It records the new revision; runstate.ErrFenced means the lease is lost.
func (rc *record) put(ctx context.Context) error {
	for _, n := range rc.noters {
		n.Note(&rc.st)
	}
	from := rc.from
	rc.from = rc.st.State
	rev, err := rc.store.CAS(ctx, from, &rc.st, rc.rev)
	if err == nil {
		rc.rev = rev
	}
	return err
}

// toRunning records the running state of the started container id.
func (rc *record) toRunning(ctx context.Context, containerID string) error {
	rc.st.State = messages.StateRunning
	rc.st.ContainerID = containerID
	rc.st.StartedAt = time.Now().UTC()
	return rc.put(ctx)
}

// nameContainer records containerID as the run's container while the
// run is still queued: the id of a warm container it is about to hand the
// run to, which carries no run id label. A delivery after a crash between
// the hand-off and the running state then finds (and removes) it by the
// record, as it finds a cold container by its label.
func (rc *record) nameContainer(ctx context.Context, containerID string) error {
	rc.st.ContainerID = containerID
	return rc.put(ctx)
}

// toQueued records the run queued again, for reason (a retry, a
// hand-back): its container is gone.
func (rc *record) toQueued(ctx context.Context, reason string) error {
	rc.st.State = messages.StateQueued
	rc.st.Reason = reason
	return rc.put(ctx)
}

// toFinal records the run's final state with reason.
func (rc *record) toFinal(ctx context.Context, final messages.State, reason string) error {
	rc.st.State = final
	rc.st.Reason = reason
	rc.st.FinishedAt = time.Now().UTC()
	return rc.put(ctx)
}

// maskString returns s with the secrets mask masks masked (s when mask is
// nil).
func maskString(mask stage.Masker, s string) string {
	if mask == nil {
		return s
	}
	return mask.String(s)
}
