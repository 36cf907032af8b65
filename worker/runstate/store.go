// Package runstate owns a run's record: the state in the jetcrew-runs
// bucket, written only by compare-and-set along messages.Transitions (the
// lease that fences a delivery that lost its run), and the messages built
// from it (events, dead letters). The run engine and the worker's fleet
// services (cancel, dead-letterer) write through it; nothing else writes
// the bucket.
package runstate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/internal/origin"
	"github.com/jetcrew/jetcrew/messages"
)

// Store owns every write of the jetcrew-runs bucket: each is a
// compare-and-set along an edge of messages.Transitions (an illegal edge is
// an error, nothing is written), and a final record written for a run no
// delivery holds is followed by its finished event, built as a delivery
// builds it. It is safe for concurrent use.
type Store struct {
	kv       jetstream.KeyValue
	js       jetstream.JetStream
	workerID string
	log      zerolog.Logger
}

// NewStore returns the Store of the runs bucket kv, publishing events
// through js as worker workerID (the finished events of Finalize), logging
// to log.
func NewStore(kv jetstream.KeyValue, js jetstream.JetStream, workerID string, log zerolog.Logger) *Store {
	return &Store{kv: kv, js: js, workerID: workerID, log: log}
}

// ErrFenced is returned by a write when the run's record changed since the
// writer read it: another delivery claimed the run, or a cancel finalised
// it. A delivery must then stop acting for the run.
var ErrFenced = errors.New("run state changed under this delivery (lease lost)")

// runsStream is the stream of the runs bucket.
const runsStream = "KV_" + messages.BucketRuns

// kvOperation is the header a key-value delete or purge marker carries.
const kvOperation = "KV-Operation"

// Load returns the recorded state of run id and the revision a
// compare-and-set of it must name. The recorded state is the newest record
// a worker wrote: a record the server relayed into the bucket (another
// stream's RePublish, a source: origin.Relayed) is none, whatever it says,
// and the revision is then the relayed record's, so that the next write
// replaces it. A run without a worker's record is jetstream.ErrKeyNotFound
// (IsNotFound), with the revision of whatever the key holds (0: nothing).
func (s *Store) Load(ctx context.Context, id string) (messages.RunState, uint64, error) {
	var st messages.RunState
	m, rev, err := s.newest(ctx, id)
	if err != nil {
		return st, rev, err
	}
	if err := json.Unmarshal(m.Data, &st); err != nil {
		return st, 0, fmt.Errorf("decode state of %s: %w", id, err)
	}
	return st, rev, nil
}

// newest returns the newest record of run id a worker wrote (Load) and the
// revision of the key's newest entry; a delete marker or no record of a
// worker's is jetstream.ErrKeyNotFound.
func (s *Store) newest(ctx context.Context, id string) (*jetstream.RawStreamMsg, uint64, error) {
	m, rev, err := origin.Newest(ctx, s.js.Conn(), runsStream, "$KV."+messages.BucketRuns+"."+id)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		if rev != 0 {
			s.log.Warn().Str("run_id", id).Uint64("revision", rev).Msg("the run's only records were relayed into the bucket by the server, not written by a worker: ignoring them")
		}
		return nil, rev, jetstream.ErrKeyNotFound
	case err != nil:
		return nil, 0, err
	case m.Sequence != rev:
		s.log.Warn().Str("run_id", id).Uint64("revision", rev).Msg("a record relayed into the bucket by the server, not written by a worker: reading past it")
	}
	if op := m.Header.Get(kvOperation); op != "" {
		return nil, rev, jetstream.ErrKeyNotFound
	}
	return m, rev, nil
}

// CAS writes st, stamped with the time, only if the stored revision is
// still rev (0: no record may exist), and returns the new revision. from is
// the state the writer holds the run in (messages.StateNone for none): the
// edge from → st.State must be in messages.Transitions, or cas returns an
// error and writes nothing. A conflict is ErrFenced.
//
// A try whose reply is lost is tried again; when the retry then conflicts,
// the stored record is read back, and if it is the very record this call
// wrote (the lost reply's write landed), the write counts as done. A
// conflict with records only the server relayed into the bucket since rev
// (see Load) is no lost lease: the write is tried again over them.
func (s *Store) CAS(ctx context.Context, from messages.State, st *messages.RunState, rev uint64) (uint64, error) {
	if err := messages.CheckTransition(from, st.State); err != nil {
		return 0, fmt.Errorf("run %s: %w", st.ID, err)
	}
	st.UpdatedAt = time.Now().UTC()
	b, err := json.Marshal(st)
	if err != nil {
		return 0, err
	}
	tries := 0
	err = RetryOp(ctx, func(ctx context.Context) error {
		tries++
		var err error
		var n uint64
		if rev == 0 {
			n, err = s.kv.Create(ctx, st.ID, b)
		} else {
			n, err = s.kv.Update(ctx, st.ID, b, rev)
		}
		if err == nil {
			rev = n
			return nil
		}
		if !isRevisionConflict(err) {
			return err
		}
		m, newest, gerr := s.newest(ctx, st.ID)
		switch {
		case gerr != nil && !IsNotFound(gerr):
			return gerr
		case gerr == nil && tries > 1 && bytes.Equal(m.Data, b):
			rev = newest
			return nil
		case newest > rev && (gerr != nil || m.Sequence <= rev):
			// No worker wrote since rev: only the server relayed.
			rev = newest
			return errRelayedOver
		}
		return backoff.Permanent(ErrFenced)
	})
	return rev, err
}

// errRelayedOver makes CAS try again over records the server relayed.
var errRelayedOver = errors.New("run state: records relayed by the server since the last write; writing over them")

// Finalize records the final state st for a run no delivery of this worker
// holds (a cancel, an exhausted MaxDeliver), compare-and-set against rev
// from the recorded state from, and publishes its finished event. It
// reports false when the record changed meanwhile.
func (s *Store) Finalize(ctx context.Context, from messages.State, st messages.RunState, rev uint64) (bool, error) {
	if st.FinishedAt.IsZero() {
		st.FinishedAt = time.Now().UTC()
	}
	if _, err := s.CAS(ctx, from, &st, rev); err != nil {
		if errors.Is(err, ErrFenced) {
			return false, nil
		}
		return false, fmt.Errorf("record %s state: %w", st.State, err)
	}
	ev := FinishedEvent(st)
	ev.Worker, ev.Attempt, ev.Time = s.workerID, st.Attempts, st.UpdatedAt
	if err := s.Publish(ctx, EventMsg(ev, st.StreamSeq)); err != nil {
		s.log.Warn().Err(err).Str("run_id", st.ID).Msg("publish finished event")
	}
	return true, nil
}

// MarkCancelPending sets cancel_pending on the unsuccessful final record st
// at revision rev, so a replay of the run still queued is skipped. It
// returns ErrFenced when the record changed meanwhile.
func (s *Store) MarkCancelPending(ctx context.Context, st messages.RunState, rev uint64) error {
	st.CancelPending = true
	_, err := s.CAS(ctx, st.State, &st, rev)
	return err
}

// Publish publishes m to JetStream and waits for its ack, retrying
// transient failures (its Nats-Msg-Id deduplicates a retried publish).
func (s *Store) Publish(ctx context.Context, m *nats.Msg) error {
	return RetryOp(ctx, func(ctx context.Context) error { _, err := s.js.PublishMsg(ctx, m); return err })
}

// FinishedEvent is the finished event of a run whose final record is st
// (RunID, Type and the outcome; the caller stamps Time, Attempt, Worker).
func FinishedEvent(st messages.RunState) messages.Event {
	return messages.Event{
		RunID: st.ID, Type: messages.EventFinished, State: st.State, ExitCode: st.ExitCode, OOMKilled: st.OOMKilled,
		Reason: st.Reason, ContainerID: st.ContainerID, Warm: st.Warm, Receipt: st.Receipt, Result: st.Result,
		Coordination: st.Coordination, WorkspaceResult: st.WorkspaceResult, Usage: st.Usage,
	}
}

// EventMsg builds the message of event ev of the request at stream
// sequence seq: subject jetcrew.events.<run_id>.<type>, the run id and
// attempt headers, and a Nats-Msg-Id making it one event of each type per
// request message and delivery (a retried publish whose first reply was
// lost is deduplicated by the stream) — and one finished event per request
// message, whichever delivery or cancel publishes it.
func EventMsg(ev messages.Event, seq uint64) *nats.Msg {
	b, _ := json.Marshal(ev) // an Event always marshals
	m := nats.NewMsg(messages.SubjectEvents(ev.RunID, ev.Type))
	m.Data = b
	m.Header.Set(messages.HeaderRunID, ev.RunID)
	m.Header.Set(messages.HeaderAttempt, strconv.Itoa(ev.Attempt))
	msgID := fmt.Sprintf("ev-%s-%d-%d-%s", ev.RunID, seq, ev.Attempt, ev.Type)
	if ev.Type == messages.EventFinished {
		msgID = fmt.Sprintf("ev-%s-%d-finished", ev.RunID, seq)
	}
	m.Header.Set(jetstream.MsgIDHeader, msgID)
	return m
}

// IsNotFound reports whether err says a JetStream key or message does not exist.
func IsNotFound(err error) bool {
	return errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrMsgNotFound)
}

// isRevisionConflict reports whether err is a key-value compare-and-set
// conflict: Create of an existing key, or Update with a stale revision.
func isRevisionConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}
