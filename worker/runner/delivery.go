package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/runstate"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/nats-io/nats.go/jetstream"
)

// Handle runs one delivered request to an outcome: ack (final state
// recorded), term (dead letter recorded) or nak (handed back for a retry).
// It never panics the worker on bad input, and returns once the outcome is
// recorded (or the run handed back when ctx ends: the worker stops). The
// steps: read the request (newRun), compare with the recorded state
// (resume), claim the run, check the request (admit), then execute it.
func (e *Runner) Handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		e.log.Error().Err(err).Str("subject", msg.Subject()).Msg("message without JetStream metadata; terminating it")
		_ = msg.Term()
		return
	}
	e.cfg.Failpoint(stage.FailpointAfterFetch)
	e.cfg.Metrics.inFlight.Inc()
	defer e.cfg.Metrics.inFlight.Dec()
	if meta.NumDelivered > 1 {
		e.cfg.Metrics.redelivered.Inc()
	}
	r, pool, decErr := e.newRun(msg, meta)
	// Keep the delivery alive for as long as we hold it, from before the
	// first state read until the outcome is recorded, so a slow key-value
	// write (a leader election, say) never lets AckWait hand the request to
	// a second worker while this one still acts on it.
	d := delivery{r}
	stopProgress := d.keepInProgress()
	defer stopProgress()

	// Tracked before any claim is written: a cancel that sees the claim
	// asks this worker (cancel.go).
	e.live.track(r, nil)
	defer e.live.untrack(r)
	// Most first deliveries find no state (the submitter writes none):
	// claim by creating it, and read only when one exists.
	if meta.NumDelivered == 1 {
		switch created, err := d.claimNew(ctx); {
		case err != nil:
			r.retry(ctx, fmt.Errorf("claim run: %w", err))
			return
		case created:
			if prof, ok := d.admit(ctx, pool, decErr); ok {
				r.execute(ctx, prof)
			}
			return
		}
	}
	// Idempotency by run id and stream sequence; see decide.
	prev, rev, err := e.cfg.Store.Load(ctx, r.req.ID)
	if err != nil && !runstate.IsNotFound(err) {
		r.retry(ctx, fmt.Errorf("read run state: %w", err))
		return
	}
	if err == nil {
		r.rec.from = prev.State
		r.prevContainer = prev.ContainerID
		if d.leaveToHolder(ctx, prev) {
			return
		}
		if d.resume(ctx, prev, rev) {
			return
		}
	}
	r.rec.rev = rev
	if !d.claim(ctx) {
		return
	}
	if prof, ok := d.admit(ctx, pool, decErr); ok {
		r.execute(ctx, prof)
	}
}

// newRun reads a delivered request into a run in state queued. A request
// that cannot be decoded still gets a run (under its salvaged or derived
// id), and its decoding error is returned so the run fails once claimed.
func (e *Runner) newRun(msg jetstream.Msg, meta *jetstream.MsgMetadata) (*run, string, error) {
	r := &run{e: e, msg: msg, meta: meta}
	r.rec.store = e.cfg.Store
	pool, _ := messages.PoolFromSubject(msg.Subject())
	// A request that names no pool belongs to the pool it was published to.
	req, decErr := messages.DecodeRunRequestInPool(msg.Data(), pool)
	if decErr != nil {
		req = messages.RunRequest{ID: messages.SalvageRunID(msg.Data())}
	}
	if req.ID == "" {
		req.ID = runstate.DeriveRunID(meta)
		r.idDerived = true
	}
	r.req = req
	r.operatorReplay = messages.IsReplaySubject(msg.Subject())
	r.rec.st = messages.RunState{
		Version: messages.StateVersion,
		ID:      req.ID,
		State:   messages.StateQueued,
		Profile: req.Profile,
		Pool:    pool,
		// Group stays empty until admit has let the run into its group:
		// a run refused its group never shows as one of the group's.
		Worker:    e.cfg.WorkerID,
		Attempts:  int(meta.NumDelivered),
		StreamSeq: meta.Sequence.Stream,
		Labels:    req.Labels,
		QueuedAt:  meta.Timestamp.UTC(),

		RequestDigest: messages.RequestDigest(msg.Data()),
		// The lease a successor that adopts the run acknowledges on.
		Lease: msg.Reply(),
	}
	r.log = e.log.With().Str("run_id", req.ID).Uint64("attempt", meta.NumDelivered).Logger()
	r.ctl.e, r.ctl.log = e, r.log
	return r, pool, decErr
}

// delivery is a run seen as the delivered message it came in: what the
// request and the run's record say before it may execute (read, decide,
// claim, admit), and the refusals that end it there.
type delivery struct{ *run }

// resume acts on a request whose run id already has a recorded state prev
// (at revision rev), as decide says. It returns true when the delivery is
// done (acked, dead-lettered again, refused, or skipped as cancelled);
// false when the run is to be claimed and run, with its queue time and
// replay count carried over.
func (r delivery) resume(ctx context.Context, prev messages.RunState, rev uint64) bool {
	meta := r.meta
	v := r.decide(prev)
	if (v == verdictAck || v == verdictRedeadLetter) && meta.NumDelivered > 1 {
		// The delivery that recorded the outcome died before removing
		// the request; remove its container too.
		if err := r.e.RemoveRunContainers(ctx, r.req.ID, prev.ContainerID); err != nil {
			r.log.Warn().Err(err).Msg("remove the finished run's containers; the reconciler will retry")
		}
	}
	switch v {
	case verdictAck:
		r.log.Info().Str("state", string(prev.State)).Msg("run already final; acking without running")
		if prev.StreamSeq == meta.Sequence.Stream {
			// The delivery that recorded the outcome may have died
			// before its finished event: publish it (deduplicated).
			r.rec.st = prev
			r.publishFinished(ctx)
		}
		r.ack()
		return true
	case verdictRedeadLetter:
		// Redelivered after its final state was recorded but before the
		// dead letter was acknowledged: publish it again (deduplicated by
		// its message id) and remove the request.
		r.rec.st = prev
		r.finishRemoval(ctx)
		return true
	case verdictDuplicate:
		r.refuseDuplicate(ctx, prev)
		return true
	case verdictReplay:
		if r.signedProfile() && !r.operatorReplay {
			r.refuseSignedReplay(ctx, prev)
			return true
		}
		r.rec.st.Replays = prev.Replays + 1
		if prev.CancelPending {
			// Cancelled while this replay was queued: skip it.
			r.rec.rev = rev
			r.rec.st.QueuedAt = meta.Timestamp.UTC()
			r.finish(ctx, messages.StateCancelled, "cancelled while queued (a replay)")
			return true
		}
	default:
		// A redelivery (or an older client's queued record): the same request,
		// so a replay stays counted.
		r.rec.st.Replays = prev.Replays
	}
	r.rec.st.QueuedAt = prev.QueuedAt
	if r.rec.st.QueuedAt.IsZero() {
		r.rec.st.QueuedAt = meta.Timestamp.UTC()
	}
	return false
}

// leaveToHolder reports whether this delivery is a redelivery of a run
// that lives on in its container (running, with a lease): held by a live
// worker (the one that started it, or one that adopted it after that one
// stopped or died), which keeps the request in progress on the run's
// lease and removes it when the run ends, so this delivery does nothing
// with it. A run nobody answers for is given the adoption grace once: a
// successor of its worker on its host may yet adopt it, so the request is
// handed back for AdoptGrace, and only a later delivery claims the run and
// starts it again (removing its container), as before adoption existed.
func (r delivery) leaveToHolder(ctx context.Context, prev messages.RunState) bool {
	if prev.StreamSeq != r.meta.Sequence.Stream || prev.State != messages.StateRunning || prev.Lease == "" {
		return false
	}
	if h := r.e.live.get(prev.ID); h != nil && h != r.run && holdsContainer(h) || r.e.askHolder(prev.ID, 2*time.Second) {
		r.log.Info().Str("holder", prev.Worker).Msg("redelivered run lives on, held by its worker; leaving the request to it")
		return true
	}
	if int(r.meta.NumDelivered) > prev.Attempts+1 || r.e.cfg.AdoptGrace <= 0 || !r.e.MayBeAdopted(r.req, prev) {
		return false
	}
	r.log.Info().Str("holder", prev.Worker).Dur("grace", r.e.cfg.AdoptGrace).
		Msg("redelivered run's worker does not answer; handing the request back for a successor to adopt its container")
	_ = r.msg.NakWithDelay(r.e.cfg.AdoptGrace)
	return true
}

// claimNew records the run queued under this delivery when no state exists
// for it (a compare-and-set against "no record", so a run some delivery or
// a cancel recorded is never overwritten): the lease, as claim takes it,
// one read fewer. It reports false, and writes nothing, when a state exists.
func (r delivery) claimNew(ctx context.Context) (bool, error) {
	if err := r.rec.put(ctx); err != nil {
		r.rec.from = messages.StateNone
		if errors.Is(err, runstate.ErrFenced) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// claim records the run queued under this delivery: this write, checked
// against the revision just read, is the lease. Every later write checks
// the revision this one returns, so a worker that lost the run (another
// delivery claimed it, or a cancel finalised it) can no longer record
// anything. It returns false when the run is not this delivery's to run
// (handed back to decide again, or to retry).
func (r delivery) claim(ctx context.Context) bool {
	if err := r.rec.put(ctx); err != nil {
		if errors.Is(err, runstate.ErrFenced) {
			r.log.Info().Msg("state changed while claiming the run; handing the request back to decide again")
			_ = r.msg.NakWithDelay(100 * time.Millisecond)
			return false
		}
		r.retry(ctx, fmt.Errorf("claim run: %w", err))
		return false
	}
	return true
}

// admit checks a claimed request (it decoded, it names the pool it was
// published to and a profile this worker has) and returns its profile; it
// fails the run and returns false otherwise.
func (r delivery) admit(ctx context.Context, pool string, decErr error) (*profile.Profile, bool) {
	if decErr != nil {
		r.fail(ctx, decErr.Error(), nil)
		return nil, false
	}
	if r.req.Pool != pool {
		r.fail(ctx, fmt.Sprintf("request names pool %q but was published to %s", r.req.Pool, r.msg.Subject()), nil)
		return nil, false
	}
	ps := r.e.currentProfiles()
	p, ok := ps[r.req.Profile]
	if !ok {
		r.fail(ctx, fmt.Sprintf("unknown profile %q (this worker has: %v)", r.req.Profile, ps.Names()), nil)
		return nil, false
	}
	prof := &p
	bodyID := r.req.ID
	if r.idDerived {
		bodyID = ""
	}
	if err := profile.VerifySignedRequest(r.msg.Headers(), r.msg.Data(), bodyID, prof.SignedBy); err != nil {
		r.fail(ctx, err.Error(), nil)
		return nil, false
	}
	if err := prof.CheckRequest(r.req); err != nil {
		r.fail(ctx, err.Error(), nil)
		return nil, false
	}
	if !r.admitGroup(ctx, bodyID) {
		return nil, false
	}
	return prof, true
}

// admitGroup lets the run into its group (coordination.Groups.Admit): the
// group's record is created by its first run, and a run that does not match
// it fails with the reason (a dead letter, never retried); a NATS error is
// retried. It returns false when the run goes no further.
func (r delivery) admitGroup(ctx context.Context, bodyID string) bool {
	err := r.e.cfg.Groups.Admit(ctx, coordination.Admission{Request: r.req, BodyID: bodyID, Header: r.msg.Headers(), Body: r.msg.Data()})
	switch {
	case errors.Is(err, coordination.ErrGroupRefused):
		r.fail(ctx, err.Error(), nil)
		return false
	case err != nil:
		r.retry(ctx, fmt.Errorf("admit to group %s: %w", r.req.GroupRef(), err))
		return false
	}
	r.rec.st.Group = r.req.GroupOrID()
	return true
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
//   - the state was written before any worker saw a message (sequence 0:
//     a cancel recorded it, or an older client's submit): run it, or ack
//     when already final
//     (cancelled while queued).
//   - the state belongs to another request body (RequestDigest): a reused
//     run id, refused.
//   - the state belongs to another message: a duplicate submit. Refused when
//     that run succeeded or is still queued or running; run anew (a replay)
//     when it failed, timed out or was cancelled. (resume refuses that
//     replay too for a signed profile's request that did not come on the
//     pool's replay subject.)
func (r delivery) decide(prev messages.RunState) verdict {
	seq := r.meta.Sequence.Stream
	switch {
	case prev.StreamSeq == seq && prev.State.Unsuccessful():
		return verdictRedeadLetter
	case prev.StreamSeq == seq && prev.State.Final():
		return verdictAck
	case prev.StreamSeq == seq:
		return verdictRun
	case r.otherRequest(prev):
		return verdictDuplicate
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

// signedProfile reports whether the request names a profile of this worker
// that requires signed requests (signed_by).
func (r delivery) signedProfile() bool {
	p, ok := r.e.currentProfiles()[r.req.Profile]
	return ok && len(p.SignedBy) > 0
}

// refuseSignedReplay acks, without running it, a request that would run
// again a run of a signed profile that has ended (prev): a signed request
// runs once, and only an operator replays it, on the pool's replay subject.
// Anyone who read the request (a submitter may read queued requests,
// headers included) could publish the same signed bytes again; the
// signature cannot tell the copy from the original, the subject it came on
// can. The refusal is said on the run's events and in the log.
func (r delivery) refuseSignedReplay(ctx context.Context, prev messages.RunState) {
	reason := fmt.Sprintf("duplicate request refused: run %s is already %s, and profile %s's signed requests run once; only an operator replays one, on %s (jetcrew replay) (request stream sequence %d, this one %d)",
		r.req.ID, prev.State, r.req.Profile, messages.SubjectReplay(r.rec.st.Pool), prev.StreamSeq, r.meta.Sequence.Stream)
	r.log.Warn().Str("state", string(prev.State)).Msg(reason)
	r.event(ctx, messages.Event{Type: messages.EventDuplicate, State: prev.State, Reason: reason})
	r.ack()
}

// refuseDuplicate acks a second request for a run id without running it,
// and says so on the run's events and in the log.
func (r delivery) refuseDuplicate(ctx context.Context, prev messages.RunState) {
	reason := r.duplicateReason(prev)
	r.log.Warn().Str("state", string(prev.State)).Msg(reason)
	r.event(ctx, messages.Event{Type: messages.EventDuplicate, State: prev.State, Reason: reason})
	r.ack()
}

// keepInProgress sends InProgress every InProgressInterval until the
// returned function is called, so a run longer than AckWait is not
// redelivered.
func (r delivery) keepInProgress() func() {
	return tickUntilStopped(r.e.cfg.InProgressInterval, func() {
		if err := r.msg.InProgress(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			r.log.Warn().Err(err).Msg("in-progress")
		}
	})
}

// otherRequest reports whether prev, the recorded state of this message's run
// id, belongs to a request with another body (messages.RequestDigest): a
// submitter reusing a run id. Such a message is never a redelivery or a
// replay of the recorded run, so handle refuses it as a duplicate. A state
// without a digest (written before digests existed) is not compared.
func (r delivery) otherRequest(prev messages.RunState) bool {
	return prev.RequestDigest != "" && r.rec.st.RequestDigest != "" && prev.RequestDigest != r.rec.st.RequestDigest
}

// duplicateReason says why a request for a run id that has a state is
// refused.
func (r delivery) duplicateReason(prev messages.RunState) string {
	if r.otherRequest(prev) {
		return fmt.Sprintf("duplicate request refused: run id %s is already used by a different request (%s, request stream sequence %d, this one %d); submit with a new id",
			r.req.ID, prev.State, prev.StreamSeq, r.meta.Sequence.Stream)
	}
	return fmt.Sprintf("duplicate request refused: run %s is already %s (request stream sequence %d, this one %d)",
		r.req.ID, prev.State, prev.StreamSeq, r.meta.Sequence.Stream)
}
