package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// DeadLetters lists, archives, discards and replays the dead letters of failed runs.
// It is the Dispatcher's role for the operator's failed runs: the
// JETCREW_FAILED stream (Failed, LastDeadLetter, Archive, Unarchive,
// Discard) and the replay of a dead letter (Replay, WatchReplay). It reads
// runs' states through RunStates and follows a replay through Events.
type DeadLetters struct {
	js     jetstream.JetStream
	runs   *RunStates
	events *Events
}

// defaultRequestTimeout bounds a request/reply call whose ctx has no
// deadline.
const defaultRequestTimeout = 30 * time.Second

// DeadLetter is one message of the dead-letter stream JETCREW_FAILED: the
// request of a run that ended failed or timed out, exactly as it was
// submitted, with the headers saying why (docs/wire.md, "Dead letters").
type DeadLetter struct {
	// Sequence is the message's sequence in JETCREW_FAILED.
	Sequence uint64
	// Subject is jetcrew.failed.<pool>.<run_id>.
	Subject string
	// Pool and RunID are the subject's last two tokens.
	Pool, RunID string
	// Time is when the dead letter was stored.
	Time time.Time
	// State is the run's final state (header Jetcrew-State).
	State messages.State
	// Reason says why the run failed (header Jetcrew-Error).
	Reason string
	// Attempts is the number of deliveries the run had (header
	// Jetcrew-Attempts); 0 when absent.
	Attempts int
	// ExitCode is the process's exit code (header Jetcrew-Exit-Code); nil
	// when the process never ran.
	ExitCode *int
	// Worker is the worker that gave up on the run (header Jetcrew-Worker).
	Worker string
	// Request is the message body: the run request byte for byte as it was
	// submitted (not necessarily valid, for a run that failed because it was
	// not).
	Request []byte
	// Signer and Signature are the request's signature headers
	// (messages.HeaderSigner, messages.HeaderSignature), copied by the
	// worker; empty for an unsigned request. Replay publishes them again.
	Signer, Signature string
	// GroupSignature is the request's messages.HeaderGroupSignature, the
	// signature by its group_key, copied by the worker; empty for a
	// request without one. Replay publishes it again.
	GroupSignature string
	// Archived is true when an operator archived the run's dead letters
	// (Archive) after this one was stored: kept, and out of the way.
	Archived bool
}

// Failed returns the dead letters of pool, or of every pool when pool is
// empty, oldest first, each Archived when an archive mark of its run
// (Archive) was stored after it. It reads JETCREW_FAILED with direct gets
// (it creates no consumer, so read access to the stream is enough) and
// returns once it has read every message stored when it started. The
// error wraps ErrNotProvisioned when the stream does not exist.
func (dls *DeadLetters) Failed(ctx context.Context, pool string) ([]DeadLetter, error) {
	filter := messages.SubjectFailedPrefix + ".>"
	if pool != "" {
		if err := messages.ValidateToken("pool", pool); err != nil {
			return nil, fmt.Errorf("failed runs: %w", err)
		}
		filter = messages.SubjectFailed(pool, ">")
	}
	stream, err := dls.js.Stream(ctx, messages.StreamFailed)
	if err != nil {
		return nil, fmt.Errorf("failed runs: stream %s: %w", messages.StreamFailed, classify(err))
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("failed runs: stream %s: %w", messages.StreamFailed, classify(err))
	}
	var out []DeadLetter
	marks := map[string]uint64{} // run id: its latest archive mark's sequence
	last := info.State.LastSeq
	for seq := info.State.FirstSeq; seq <= last && seq > 0; {
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break // none left at or after seq
		}
		if err != nil {
			return nil, fmt.Errorf("failed runs: read %s: %w", messages.StreamFailed, err)
		}
		if m.Sequence > last {
			break // stored after we started
		}
		seq = m.Sequence + 1
		if id, ok := archiveMark(m.Subject); ok {
			marks[id] = m.Sequence
			continue
		}
		if strings.Count(m.Subject, ".") == 3 {
			out = append(out, newDeadLetter(m.Sequence, m.Subject, m.Time, m.Header, m.Data))
		}
	}
	for i := range out {
		out[i].Archived = marks[out[i].RunID] > out[i].Sequence
	}
	return out, nil
}

// archiveMark returns the run id of an archive mark's subject
// (messages.SubjectFailedArchived), and false for any other subject.
func archiveMark(subject string) (string, bool) {
	t := strings.Split(subject, ".")
	if len(t) != 5 || t[4] != messages.ArchivedToken || subject != messages.SubjectFailedArchived(t[2], t[3]) {
		return "", false
	}
	return t[3], true
}

// LastDeadLetter returns the latest dead letter of run id, whatever its
// pool (subject jetcrew.failed.*.<run_id>). The error wraps ErrNoDeadLetter
// when there is none, and ErrNotProvisioned when the stream does not exist.
func (dls *DeadLetters) LastDeadLetter(ctx context.Context, id string) (DeadLetter, error) {
	return lastDeadLetter(ctx, dls.js, id)
}

// lastDeadLetter is LastDeadLetter over js, for RunStates.Asked too.
func lastDeadLetter(ctx context.Context, js jetstream.JetStream, id string) (DeadLetter, error) {
	if err := messages.ValidateToken("run id", id); err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter: %w", err)
	}
	stream, err := js.Stream(ctx, messages.StreamFailed)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter of run %s: stream %s: %w", id, messages.StreamFailed, classify(err))
	}
	// A direct get takes one literal subject, so find the run's subjects
	// (one per pool it failed in) first, then the last message of each.
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(messages.SubjectFailed("*", id)))
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter of run %s: %w", id, classify(err))
	}
	var best *jetstream.RawStreamMsg
	for subj := range info.State.Subjects {
		m, err := stream.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // expired meanwhile
		}
		if err != nil {
			return DeadLetter{}, fmt.Errorf("dead letter of run %s: get %s: %w", id, subj, err)
		}
		if best == nil || m.Sequence > best.Sequence {
			best = m
		}
	}
	if best == nil {
		return DeadLetter{}, fmt.Errorf("run %s: %w on %s", id, ErrNoDeadLetter, messages.StreamFailed)
	}
	return newDeadLetter(best.Sequence, best.Subject, best.Time, best.Header, best.Data), nil
}

func newDeadLetter(seq uint64, subject string, t time.Time, h nats.Header, data []byte) DeadLetter {
	dl := DeadLetter{
		Sequence: seq,
		Subject:  subject,
		Time:     t.UTC(),
		State:    messages.State(h.Get(messages.HeaderState)),
		Reason:   h.Get(messages.HeaderError),
		Worker:   h.Get(messages.HeaderWorker),
		Request:  data,

		Signer:    h.Get(messages.HeaderSigner),
		Signature: h.Get(messages.HeaderSignature),

		GroupSignature: h.Get(messages.HeaderGroupSignature),
	}
	if rest, ok := strings.CutPrefix(subject, messages.SubjectFailedPrefix+"."); ok {
		dl.Pool, dl.RunID, _ = strings.Cut(rest, ".")
	}
	if id := h.Get(messages.HeaderRunID); dl.RunID == "" {
		dl.RunID = id
	}
	dl.Attempts, _ = strconv.Atoi(h.Get(messages.HeaderAttempts))
	if c, err := strconv.Atoi(h.Get(messages.HeaderExitCode)); err == nil {
		dl.ExitCode = &c
	}
	return dl
}

// Discard deletes every dead letter of run id from JETCREW_FAILED, in
// whatever pool: one purge of the subject jetcrew.failed.*.<run_id>, which
// the operator role may do (it may purge jetcrew's streams; it may not
// delete one message, which could leave an older dead letter a run's
// latest). The run can no longer be replayed; its state is untouched. It
// returns the number of dead letters deleted; the error wraps
// ErrNoDeadLetter when the run has none, and ErrNotProvisioned when the
// stream does not exist.
func (dls *DeadLetters) Discard(ctx context.Context, id string) (uint64, error) {
	if err := messages.ValidateToken("run id", id); err != nil {
		return 0, fmt.Errorf("discard: %w", err)
	}
	stream, err := dls.js.Stream(ctx, messages.StreamFailed)
	if err != nil {
		return 0, fmt.Errorf("discard run %s: stream %s: %w", id, messages.StreamFailed, classify(err))
	}
	subj := messages.SubjectFailed("*", id)
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return 0, fmt.Errorf("discard run %s: %w", id, classify(err))
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	if n == 0 {
		return 0, fmt.Errorf("run %s: %w on %s", id, ErrNoDeadLetter, messages.StreamFailed)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
		return 0, fmt.Errorf("discard run %s: purge %s: %w", id, subj, classify(err))
	}
	if err := purgeArchiveMarks(ctx, stream, id); err != nil {
		return 0, fmt.Errorf("discard run %s: %w", id, err)
	}
	return n, nil
}

// purgeArchiveMarks deletes run id's archive marks (one purge of
// jetcrew.failed.*.<run_id>.archived).
func purgeArchiveMarks(ctx context.Context, stream jetstream.Stream, id string) error {
	subj := messages.SubjectFailedArchived("*", id)
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
		return fmt.Errorf("purge %s: %w", subj, classify(err))
	}
	return nil
}

// Archive archives run id's dead letters: they stay in JETCREW_FAILED
// (Replay still reads them) and Failed reports them Archived, which the
// console's dead letters page hides by default (as River UI and asynq
// archive a job). The mark is a message in JETCREW_FAILED on
// jetcrew.failed.<pool>.<run_id>.archived (the pool of the run's latest
// dead letter), which the operator role may publish; its body is empty.
// An older mark is purged first, so a run keeps one. A dead
// letter stored after the mark (the run failed again) is not archived.
// The error wraps ErrNoDeadLetter when the run has none, and
// ErrNotProvisioned when the stream does not exist.
func (dls *DeadLetters) Archive(ctx context.Context, id string) error {
	dl, err := dls.LastDeadLetter(ctx, id)
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	stream, err := dls.js.Stream(ctx, messages.StreamFailed)
	if err != nil {
		return fmt.Errorf("archive run %s: stream %s: %w", id, messages.StreamFailed, classify(err))
	}
	if err := purgeArchiveMarks(ctx, stream, id); err != nil {
		return fmt.Errorf("archive run %s: %w", id, err)
	}
	m := nats.NewMsg(messages.SubjectFailedArchived(dl.Pool, id))
	m.Header.Set(messages.HeaderRunID, id)
	if _, err := dls.js.PublishMsg(ctx, m, jetstream.WithExpectStream(messages.StreamFailed)); err != nil {
		return fmt.Errorf("archive run %s: publish %s: %w", id, m.Subject, classify(err))
	}
	return nil
}

// Unarchive takes run id's dead letters out of the archive (Archive):
// one purge of its marks. Unarchiving a run that is not archived changes
// nothing. The error wraps ErrNotProvisioned when the stream does not
// exist.
func (dls *DeadLetters) Unarchive(ctx context.Context, id string) error {
	if err := messages.ValidateToken("run id", id); err != nil {
		return fmt.Errorf("unarchive: %w", err)
	}
	stream, err := dls.js.Stream(ctx, messages.StreamFailed)
	if err != nil {
		return fmt.Errorf("unarchive run %s: stream %s: %w", id, messages.StreamFailed, classify(err))
	}
	if err := purgeArchiveMarks(ctx, stream, id); err != nil {
		return fmt.Errorf("unarchive run %s: %w", id, err)
	}
	return nil
}

// Fate is what became of a run since its latest dead letter.
type Fate string

// The fates of a run with a dead letter.
const (
	// FateFailing: the run is still failed (or has no state): replaying
	// it is the next step.
	FateFailing Fate = "failing"
	// FateReplaying: a replay of the run waits in JETCREW_RUNS, or the
	// run is queued or running again.
	FateReplaying Fate = "replaying"
	// FateHealed: the run succeeded since, a replay healed it: resolved.
	FateHealed Fate = "healed"
	// FateCancelled: the run was cancelled since (its replay, maybe).
	FateCancelled Fate = "cancelled"
)

// Resolved reports whether a dead letter of this fate needs nothing more:
// its run was healed.
func (f Fate) Resolved() bool { return f == FateHealed }

// FateOf says what became of a run with a dead letter, from its state now
// (ok false: it has none) and whether a replay of it waits in
// JETCREW_RUNS (ReplaysWaiting). A succeeded run is healed even when a
// replay request is still in JETCREW_RUNS: a succeeded run's replay is
// refused, so that request is the one that healed it, in the moment
// between its finished state and its ack.
func FateOf(st messages.RunState, ok, waiting bool) Fate {
	switch {
	case ok && st.State == messages.StateSucceeded:
		return FateHealed
	case waiting || (ok && (st.State == messages.StateQueued || st.State == messages.StateRunning)):
		return FateReplaying
	case ok && st.State == messages.StateCancelled:
		return FateCancelled
	}
	return FateFailing
}

// ReplaysWaiting returns the run ids of the replays among reqs (Requests):
// the runs FateOf calls replaying before a worker takes them. A run's own
// request, which stays in JETCREW_RUNS a moment after its dead letter is
// stored, is not one.
func ReplaysWaiting(reqs []QueuedRequest) map[string]bool {
	out := map[string]bool{}
	for _, r := range reqs {
		if r.Replay && r.ID != "" {
			out[r.ID] = true
		}
	}
	return out
}
