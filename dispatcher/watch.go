package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/internal/origin"
	"github.com/jetcrew/jetcrew/messages"
)

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
func (d *Dispatcher) Watch(ctx context.Context, id string, fn func(WatchEvent) error) (messages.Event, error) {
	return d.watch(ctx, id, watchFrom{}, fn)
}

// watchFrom narrows what watch follows to one request of a run, for
// WatchReplay. The zero value follows the run from its first event.
type watchFrom struct {
	// afterEvent: only events after this JETCREW_EVENTS sequence are read.
	afterEvent uint64
	// requestSeq, when not 0: the run's state counts as final only when its
	// StreamSeq is this, and a duplicate event may mean the request was
	// refused.
	requestSeq uint64
}

// dupRecheck is how often watch looks again whether a replayed request was
// refused, after a duplicate event, until it knows.
const dupRecheck = 250 * time.Millisecond

func (d *Dispatcher) watch(ctx context.Context, id string, from watchFrom, fn func(WatchEvent) error) (messages.Event, error) {
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
	cons, err := d.js.OrderedConsumer(ctx, messages.StreamEvents, occ)
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
	if kv, err := d.runsBucket(ctx); err == nil {
		if kw, err := kv.Watch(ctx, id); err == nil {
			defer func() { _ = kw.Stop() }()
			updates = kw.Updates()
		}
	}

	w := &watcher{d: d, id: id, from: from, fn: newOutputOrder().wrap(fn)}
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

// watcher is what watch knows of a run while following it: the events
// read, the final state seen, and the timers that bound waiting for a
// finished event or a replay's refusal.
type watcher struct {
	d    *Dispatcher
	id   string
	from watchFrom
	fn   func(WatchEvent) error

	final   messages.RunState
	grace   *time.Timer
	graceC  <-chan time.Time
	pending uint64 // events left on the stream after the last one read
	lastSeq uint64 // stream sequence of the last event read
	// lastFin is the latest finished event read, while no event has shown
	// the run going on after it (a replay's started event).
	lastFin *messages.Event
	// dupC ticks while a duplicate event may mean that the replayed request
	// was refused (from.requestSeq), until that is known.
	dup    *time.Ticker
	dupC   <-chan time.Time
	dupWhy string
}

// stop stops the watcher's timers.
func (w *watcher) stop() {
	if w.grace != nil {
		w.grace.Stop()
	}
	if w.dup != nil {
		w.dup.Stop()
	}
}

// checkRefused looks whether the replayed request was refused (an error
// wrapping ErrReplayRefused), and stops looking once it knows that it was
// not.
func (w *watcher) checkRefused(ctx context.Context) error {
	refused, err := w.d.replayRefused(ctx, w.id, w.from.requestSeq)
	if err != nil {
		return nil // look again at the next tick
	}
	if refused {
		return fmt.Errorf("watch run %s: %w: %s", w.id, ErrReplayRefused, w.dupWhy)
	}
	if st, err := w.d.Status(ctx, w.id); err == nil && st.StreamSeq == w.from.requestSeq && w.dup != nil {
		w.dup.Stop()
		w.dupC = nil
	}
	return nil
}

// onEvent handles one event read from the stream: it passes it to fn and
// reports the run's end (its finished event) with end true.
func (w *watcher) onEvent(ctx context.Context, m jetstream.Msg) (messages.Event, bool, error) {
	if origin.Relayed(m.Headers()) {
		// The server relayed it into the run's subjects (another stream's
		// RePublish, a source): no worker published it.
		return messages.Event{}, false, nil
	}
	ev, err := parseEvent(m)
	if err != nil {
		return messages.Event{}, false, fmt.Errorf("watch run %s: %w", w.id, err)
	}
	w.pending = 0
	if meta, err := m.Metadata(); err == nil {
		w.pending = meta.NumPending
	}
	w.lastSeq = max(w.lastSeq, ev.Sequence)
	if w.fn != nil {
		if err := w.fn(ev); err != nil {
			return messages.Event{}, false, err
		}
	}
	switch {
	case ev.Type == messages.EventFinished && w.from.requestSeq != 0:
		// Following a replay: the first finished event after it is the
		// replay's.
		return ev.Event, true, nil
	case ev.Type == messages.EventFinished:
		// A replayed run has a finished event per replay: the run ends
		// with the latest one.
		fin := ev.Event
		w.lastFin = &fin
	case ev.Type == messages.EventStarted:
		w.lastFin = nil // a replay of the run started after it
	}
	if w.lastFin != nil && w.pending == 0 && w.d.latestFinish(ctx, w.id, *w.lastFin) {
		return *w.lastFin, true, nil
	}
	if ev.Type == messages.EventDuplicate && w.from.requestSeq != 0 {
		w.dupWhy = ev.Event.Reason
		if w.dup == nil {
			w.dup = time.NewTicker(dupRecheck)
		} else {
			w.dup.Reset(dupRecheck)
		}
		w.dupC = w.dup.C
		return messages.Event{}, false, w.checkRefused(ctx)
	}
	return messages.Event{}, false, nil
}

// onState handles an update of the run's state: a final state ends the
// watch when its finished event was read, and otherwise starts the grace
// period for that event.
func (w *watcher) onState(e jetstream.KeyValueEntry) (messages.Event, bool) {
	if e == nil || e.Operation() != jetstream.KeyValuePut {
		return messages.Event{}, false
	}
	st, err := decodeState(w.id, e.Value())
	if err != nil || !st.State.Final() {
		return messages.Event{}, false
	}
	if w.from.requestSeq != 0 && st.StreamSeq != w.from.requestSeq {
		return messages.Event{}, false // the final state of the run before the replay
	}
	if w.lastFin != nil && w.pending == 0 && finishOf(st, *w.lastFin) {
		return *w.lastFin, true
	}
	w.final = st
	if w.grace == nil {
		w.grace = time.NewTimer(w.d.finishedGrace)
		w.graceC = w.grace.C
	}
	return messages.Event{}, false
}

// onGrace ends the watch when the grace period for the finished event has
// passed: with that event if the stream's leader has it, else with one made
// from the final state (FromState) as a worker recorded it. A final state
// no worker wrote (Status passes over what the server relayed into the
// bucket) ends nothing: the watch goes on.
func (w *watcher) onGrace(ctx context.Context) (messages.Event, bool, error) {
	if w.pending > 0 {
		// Still catching up: the finished event may be among the events
		// not yet read.
		w.grace.Reset(w.d.finishedGrace)
		return messages.Event{}, false, nil
	}
	st, err := w.d.Status(ctx, w.id)
	if err != nil && !errors.Is(err, ErrRunNotFound) {
		return messages.Event{}, false, fmt.Errorf("watch run %s: %w", w.id, err)
	}
	if err != nil || !st.State.Final() || (w.from.requestSeq != 0 && st.StreamSeq != w.from.requestSeq) {
		w.grace, w.graceC = nil, nil // the next final state starts it again
		return messages.Event{}, false, nil
	}
	w.final = st
	if w.lastFin != nil && finishOf(w.final, *w.lastFin) {
		return *w.lastFin, true, nil
	}
	// The consumer may only lag (a replica catching up): read what it has
	// not delivered from the stream leader first.
	if fin, ok, err := w.d.readMissed(ctx, w.id, w.lastSeq, w.from, w.final, w.fn); err != nil {
		return messages.Event{}, false, fmt.Errorf("watch run %s: %w", w.id, err)
	} else if ok {
		return fin, true, nil
	}
	ev := eventFromState(w.final)
	if w.fn != nil {
		we := WatchEvent{Type: ev.Type, RunID: w.id, Event: ev, Attempt: ev.Attempt, Time: ev.Time, FromState: true}
		if err := w.fn(we); err != nil {
			return messages.Event{}, false, err
		}
	}
	return ev, true, nil
}

// Wait blocks until run id reaches a final state, as Watch without a
// callback, and returns that state. Its errors are Watch's and Status's.
func (d *Dispatcher) Wait(ctx context.Context, id string) (messages.RunState, error) {
	if _, err := d.Watch(ctx, id, nil); err != nil {
		return messages.RunState{}, err
	}
	return d.Status(ctx, id)
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

// eventFromState makes the finished event of a run in final state st.
func eventFromState(st messages.RunState) messages.Event {
	t := st.FinishedAt
	if t.IsZero() {
		t = st.UpdatedAt
	}
	return messages.Event{
		RunID:       st.ID,
		Type:        messages.EventFinished,
		Time:        t,
		Attempt:     st.Attempts,
		Worker:      st.Worker,
		ContainerID: st.ContainerID,
		State:       st.State,
		ExitCode:    st.ExitCode,
		Reason:      st.Reason,
	}
}

// latestFinish reports whether fin, a finished event of run id, is the end
// of the run as its state now says: the state is final and fin is not older
// than the state's finish. A run without a readable state has nothing to
// contradict fin.
func (d *Dispatcher) latestFinish(ctx context.Context, id string, fin messages.Event) bool {
	st, err := d.Status(ctx, id)
	if err != nil {
		return true
	}
	return st.State.Final() && finishOf(st, fin)
}

// finishOf reports whether fin can be the finished event of final state st:
// a worker publishes the event after it records the state, so an event
// older than the state's finish belongs to an earlier request of the run (a
// run replayed since).
func finishOf(st messages.RunState, fin messages.Event) bool {
	return st.FinishedAt.IsZero() || !fin.Time.Before(st.FinishedAt)
}
