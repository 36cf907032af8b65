package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// Replayed describes a run request Replay published again.
type Replayed struct {
	// RunID is the run the replayed request names. Empty when the request
	// carries no id: the worker then derives a new one from the new message
	// (docs/wire.md), and the replay cannot be followed by id.
	RunID string
	// Pool is the pool the request was published to (on its replay
	// subject): the dead letter's.
	Pool string
	// DeadLetter is the dead letter whose body was published.
	DeadLetter DeadLetter
	// Sequence is the replayed request's sequence in JETCREW_RUNS; the
	// worker that takes it records it as the run state's StreamSeq.
	Sequence uint64
	// Duplicate is true when this dead letter had already been replayed
	// within the stream's duplicate window: nothing new was published, and
	// Sequence is the earlier replay's.
	Duplicate bool
	// eventsAfter is the last JETCREW_EVENTS sequence before the publish:
	// the replay's events come after it.
	eventsAfter uint64
}

// ReplayMsgID returns the Nats-Msg-Id Replay publishes the dead letter at
// sequence seq of run id with: "replay-<run_id>-<seq>". Replaying one dead
// letter twice within the duplicate window stores it once; a first replay is
// never taken for a duplicate of the original submit (whose message id is
// the run id).
func ReplayMsgID(id string, seq uint64) string {
	return "replay-" + id + "-" + strconv.FormatUint(seq, 10)
}

// Replay submits a failed run again: it takes the run's latest dead letter
// (LastDeadLetter) and publishes its body, unchanged (a signed request with
// its signature headers), to the replay subject of the dead letter's pool,
// jetcrew.runs.<pool>.replay (messages.SubjectReplay), with Nats-Msg-Id
// ReplayMsgID. A worker runs it anew under the same run id and counts it in
// the run state's Replays. The replay subject is the operator's: it is the
// only one on which a signed request may run again, and a submitter may
// not publish to it (docs/security.md).
//
// Replay first reads the run's state and refuses, with an error wrapping
// ErrReplayRefused and publishing nothing, when the run succeeded (a worker
// would refuse the request as a duplicate) or is still queued or running. It
// replays only a dead letter a worker wrote for the run (see
// verifyDeadLetter): any other, a run without state included, is refused
// with an error wrapping ErrForeignDeadLetter. The error wraps
// ErrNoDeadLetter when the run has no dead letter. A run whose state says it
// ended unsuccessfully (failed, timed out, stalled) but whose dead letter is
// not stored yet (a worker stores it just after the final state, before the
// run's finished event) is waited for, a few seconds at most.
//
// WatchReplay follows the replayed run.
func (dls *DeadLetters) Replay(ctx context.Context, id string) (Replayed, error) {
	dl, err := dls.lastDeadLetterOfFailed(ctx, id)
	if err != nil {
		return Replayed{}, fmt.Errorf("replay: %w", err)
	}
	if err := messages.ValidateToken("pool", dl.Pool); err != nil {
		return Replayed{}, fmt.Errorf("replay run %s: dead letter subject %s: %w", id, dl.Subject, err)
	}
	r := Replayed{Pool: dl.Pool, DeadLetter: dl}
	if _, err := dls.verifyDeadLetter(ctx, id, dl); err != nil {
		return Replayed{}, err
	}
	r.RunID = messages.SalvageRunID(dl.Request)

	events, err := dls.js.Stream(ctx, messages.StreamEvents)
	if err != nil {
		return Replayed{}, fmt.Errorf("replay run %s: stream %s: %w", id, messages.StreamEvents, classify(err))
	}
	info, err := events.Info(ctx)
	if err != nil {
		return Replayed{}, fmt.Errorf("replay run %s: stream %s: %w", id, messages.StreamEvents, classify(err))
	}
	r.eventsAfter = info.State.LastSeq

	msg := nats.NewMsg(messages.SubjectReplay(dl.Pool))
	msg.Data = dl.Request
	if dl.Signer != "" {
		// A signed request stays signed: the body is unchanged.
		msg.Header.Set(messages.HeaderSigner, dl.Signer)
		msg.Header.Set(messages.HeaderSignature, dl.Signature)
	}
	if dl.GroupSignature != "" {
		// So is a request keyed to its group.
		msg.Header.Set(messages.HeaderGroupSignature, dl.GroupSignature)
	}
	ack, err := dls.js.PublishMsg(ctx, msg,
		jetstream.WithMsgID(ReplayMsgID(dl.RunID, dl.Sequence)),
		jetstream.WithExpectStream(messages.StreamRuns))
	if err != nil {
		return Replayed{}, fmt.Errorf("replay run %s: publish to %s: %w", id, messages.SubjectReplay(dl.Pool), classify(err))
	}
	r.Sequence, r.Duplicate = ack.Sequence, ack.Duplicate
	return r, nil
}

// deadLetterDelay bounds how long Replay waits for the dead letter of a run
// whose state says it ended unsuccessfully: a worker records the final state
// first and stores the dead letter right after it (before the run's
// finished event), so a replay sent on seeing the state may come first.
const deadLetterDelay = 3 * time.Second

// lastDeadLetterOfFailed is LastDeadLetter, waiting up to deadLetterDelay
// for the dead letter when there is none yet but the run's state is
// unsuccessful (failed, timed out or stalled: State.Unsuccessful).
func (dls *DeadLetters) lastDeadLetterOfFailed(ctx context.Context, id string) (DeadLetter, error) {
	dl, err := dls.LastDeadLetter(ctx, id)
	if !errors.Is(err, ErrNoDeadLetter) {
		return dl, err
	}
	st, serr := dls.runs.Status(ctx, id)
	if serr != nil || !st.State.Unsuccessful() {
		return dl, err
	}
	deadline := time.Now().Add(deadLetterDelay)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return DeadLetter{}, ctx.Err()
		case <-t.C:
		}
		dl, err = dls.LastDeadLetter(ctx, id)
		if !errors.Is(err, ErrNoDeadLetter) {
			return dl, err
		}
	}
	return dl, err
}

// WatchReplay follows the run a Replay published, as Watch does, but only
// from the replay on: events before the replay (the failed run's own) are
// skipped, and the run's state counts as final only once it belongs to the
// replayed request (RunState.StreamSeq is r.Sequence). It returns the
// replayed run's finished event.
//
// When a worker refuses the replayed request as a duplicate (the run
// succeeded, or was submitted again, in between), WatchReplay returns an
// error wrapping ErrReplayRefused.
func (dls *DeadLetters) WatchReplay(ctx context.Context, r Replayed, fn func(WatchEvent) error) (messages.Event, error) {
	if r.RunID == "" {
		return messages.Event{}, errors.New("watch replay: the replayed request has no id; its run id is derived by the worker and cannot be followed here")
	}
	return dls.events.watch(ctx, r.RunID, watchFrom{afterEvent: r.eventsAfter, requestSeq: r.Sequence}, fn)
}
