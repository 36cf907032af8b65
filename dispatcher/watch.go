package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// Events follows the events of runs on JETCREW_EVENTS, alone or many at once.
// It is the Dispatcher's role for watching: one run to its end (Watch,
// Wait), or every event on some subjects (Follow, FollowMessages). It reads
// runs' states through RunStates, for the finished event a run's state
// stands in for. It is safe for concurrent use.
type Events struct {
	js   jetstream.JetStream
	runs *RunStates
	// finishedGrace: see defaultFinishedGrace. Tests shorten it.
	finishedGrace time.Duration
}

// WatchEvent is one event of a run, as Watch hands it to its callback.
type WatchEvent struct {
	// Type is the event type: the last token of the event's subject.
	Type messages.EventType
	// RunID is the run the event belongs to: the subject's third token.
	RunID string
	// Event is the decoded JSON body of every event but EventOutput (zero
	// for output, and for an event type this version does not know whose
	// body is not a messages.Event).
	Event messages.Event
	// Stream is messages.StreamStdout or messages.StreamStderr, on
	// EventOutput.
	Stream string
	// Offset is where Data starts within Stream, in bytes, on EventOutput.
	Offset int64
	// Seq is the chunk's place among its attempt's output chunks of both
	// streams, from 1, in the order the worker read them (header
	// Jetcrew-Seq), on EventOutput; 0 when absent (an older worker).
	// Watch and Follow pass output in this order.
	Seq uint64
	// Data is the raw body: on EventOutput the output bytes exactly as the
	// process wrote them (not necessarily UTF-8), else the JSON document.
	// The callback may keep it.
	Data []byte
	// Attempt is the delivery number the event belongs to (header
	// Jetcrew-Attempt); 0 when absent.
	Attempt int
	// Time is when the event was stored on JETCREW_EVENTS.
	Time time.Time
	// Sequence is the event's sequence number in JETCREW_EVENTS; 0 when
	// FromState.
	Sequence uint64
	// FromState is true for a finished event that Watch made from the
	// run's final state, because the real one did not arrive: it expired
	// with the stream's age limit, or its publish was lost.
	FromState bool
}

// Watch follows the events of run id from the first one on the stream
// (however long ago the run started) and calls fn, when not nil, with each
// one in stream order, output included; each attempt's output in the
// order the worker read stdout and stderr in (WatchEvent.Seq), which a
// chunk published again after a failed publish is put back into. It returns the run's finished event
// after passing it to fn, so a run that is already over is replayed and
// returns at once. A run that was replayed (see Replay) has a finished
// event per request: Watch passes on every event and returns the latest
// finished event, the one the run's state agrees with.
//
// While it reads, Watch also watches the run's state: when the state is
// final, the stream holds no further event and the finished event has not
// arrived within a few seconds, Watch makes one from the state (see
// WatchEvent.FromState) instead of waiting forever.
//
// It returns early with fn's error, unchanged, when fn fails; with an error
// wrapping ctx.Err() when ctx ends first (the run goes on); and with an error
// wrapping ErrNotProvisioned when the event stream does not exist. A run
// that nobody submitted is waited for until ctx ends.
func (es *Events) Watch(ctx context.Context, id string, fn func(WatchEvent) error) (messages.Event, error) {
	return es.watch(ctx, id, watchFrom{}, fn)
}

func (es *Events) watch(ctx context.Context, id string, from watchFrom, fn func(WatchEvent) error) (messages.Event, error) {
	if err := messages.ValidateToken("run id", id); err != nil {
		return messages.Event{}, fmt.Errorf("watch: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	occ := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{messages.SubjectEventsAll(id)},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	}
	if from.afterEvent > 0 {
		occ.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		occ.OptStartSeq = from.afterEvent + 1
	}
	cons, err := es.js.OrderedConsumer(ctx, messages.StreamEvents, occ)
	if err != nil {
		return messages.Event{}, fmt.Errorf("watch run %s: %w", id, classify(err))
	}
	it, err := cons.Messages()
	if err != nil {
		return messages.Event{}, fmt.Errorf("watch run %s: %w", id, classify(err))
	}
	msgs, errc, done := readEvents(ctx, it)
	defer func() {
		cancel()
		it.Stop()
		<-done
	}()

	// The state watch is the fallback for a lost finished event; a run
	// without a bucket simply has no fallback.
	var updates <-chan jetstream.KeyValueEntry
	if kv, err := es.runs.runsBucket(ctx); err == nil {
		if kw, err := kv.Watch(ctx, id); err == nil {
			defer func() { _ = kw.Stop() }()
			updates = kw.Updates()
		}
	}

	w := &watcher{es: es, id: id, from: from, fn: newOutputOrder().wrap(fn)}
	defer w.stop()
	for {
		var (
			ev  messages.Event
			end bool
			err error
		)
		select {
		case <-ctx.Done():
			return messages.Event{}, fmt.Errorf("watch run %s: %w", id, ctx.Err())
		case err := <-errc:
			if ctx.Err() != nil {
				return messages.Event{}, fmt.Errorf("watch run %s: %w", id, ctx.Err())
			}
			return messages.Event{}, fmt.Errorf("watch run %s: %w", id, err)
		case m := <-msgs:
			ev, end, err = w.onEvent(ctx, m)
		case <-w.dupC:
			err = w.checkRefused(ctx)
		case e, ok := <-updates:
			if !ok {
				updates = nil
				continue
			}
			ev, end = w.onState(e)
		case <-w.graceC:
			ev, end, err = w.onGrace(ctx)
		}
		if err != nil || end {
			return ev, err
		}
	}
}

// readEvents passes the iterator's messages to msgs until Next fails (its
// error to errc), which it does once ctx ends or the iterator is stopped;
// done is closed when it has ended.
func readEvents(ctx context.Context, it jetstream.MessagesContext) (msgs chan jetstream.Msg, errc chan error, done chan struct{}) {
	msgs, errc, done = make(chan jetstream.Msg), make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := it.Next(jetstream.NextContext(ctx))
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	return msgs, errc, done
}

// Wait blocks until run id reaches a final state, as Watch without a
// callback, and returns that state. Its errors are Watch's and Status's.
func (es *Events) Wait(ctx context.Context, id string) (messages.RunState, error) {
	if _, err := es.Watch(ctx, id, nil); err != nil {
		return messages.RunState{}, err
	}
	return es.runs.Status(ctx, id)
}

// parseEvent reads one message of JETCREW_EVENTS. Only a finished event
// whose body cannot be decoded is an error: Watch could not say how the run
// ended.
func parseEvent(m jetstream.Msg) (WatchEvent, error) {
	var seq uint64
	var t time.Time
	if meta, err := m.Metadata(); err == nil {
		t, seq = meta.Timestamp, meta.Sequence.Stream
	}
	return parseStoredEvent(&jetstream.RawStreamMsg{Subject: m.Subject(), Sequence: seq, Header: m.Headers(), Data: m.Data(), Time: t})
}

// parseStoredEvent is parseEvent for a message read from the stream.
func parseStoredEvent(m *jetstream.RawStreamMsg) (WatchEvent, error) {
	subj := m.Subject
	ev := WatchEvent{
		Type:     messages.EventType(subj[strings.LastIndexByte(subj, '.')+1:]),
		Data:     m.Data,
		Time:     m.Time,
		Sequence: m.Sequence,
	}
	if rest, ok := strings.CutPrefix(subj, messages.SubjectEventsPrefix+"."); ok {
		ev.RunID, _, _ = strings.Cut(rest, ".")
	}
	h := m.Header
	ev.Attempt, _ = strconv.Atoi(h.Get(messages.HeaderAttempt))
	if ev.Type == messages.EventOutput {
		ev.Stream = h.Get(messages.HeaderStream)
		ev.Offset, _ = strconv.ParseInt(h.Get(messages.HeaderOffset), 10, 64)
		ev.Seq, _ = strconv.ParseUint(h.Get(messages.HeaderSeq), 10, 64)
		return ev, nil
	}
	if err := json.Unmarshal(ev.Data, &ev.Event); err != nil {
		if ev.Type == messages.EventFinished {
			return ev, fmt.Errorf("decode finished event (sequence %d): %w", ev.Sequence, err)
		}
		ev.Event = messages.Event{}
	}
	return ev, nil
}
