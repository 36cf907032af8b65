package dispatcher

// The watcher: how Watch and WatchReplay follow one run to its end, with the
// run's state standing in for a finished event that does not arrive.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/internal/origin"
	"github.com/jetcrew/jetcrew/messages"
)

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

// watcher is what watch knows of a run while following it: the events
// read, the final state seen, and the timers that bound waiting for a
// finished event or a replay's refusal.
type watcher struct {
	es   *Events
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
	refused, err := w.es.replayRefused(ctx, w.id, w.from.requestSeq)
	if err != nil {
		return nil // look again at the next tick
	}
	if refused {
		return fmt.Errorf("watch run %s: %w: %s", w.id, ErrReplayRefused, w.dupWhy)
	}
	if st, err := w.es.runs.Status(ctx, w.id); err == nil && st.StreamSeq == w.from.requestSeq && w.dup != nil {
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
	if w.lastFin != nil && w.pending == 0 && w.es.latestFinish(ctx, w.id, *w.lastFin) {
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
		w.grace = time.NewTimer(w.es.finishedGrace)
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
		w.grace.Reset(w.es.finishedGrace)
		return messages.Event{}, false, nil
	}
	st, err := w.es.runs.Status(ctx, w.id)
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
	if fin, ok, err := w.es.readMissed(ctx, w.id, w.lastSeq, w.from, w.final, w.fn); err != nil {
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
func (es *Events) latestFinish(ctx context.Context, id string, fin messages.Event) bool {
	st, err := es.runs.Status(ctx, id)
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

// replayRefused reports whether the replayed request at sequence seq was
// refused: a worker took it off the stream without the run's state ever
// belonging to it.
func (es *Events) replayRefused(ctx context.Context, id string, seq uint64) (bool, error) {
	st, err := es.runs.Status(ctx, id)
	if err != nil && !errors.Is(err, ErrRunNotFound) {
		return false, err
	}
	if err == nil && st.StreamSeq == seq {
		return false, nil
	}
	runs, err := es.js.Stream(ctx, messages.StreamRuns)
	if err != nil {
		return false, classify(err)
	}
	_, err = runs.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// Gone from the work queue. Read the state again: the worker claims
		// the run before it removes the request.
		st, serr := es.runs.Status(ctx, id)
		return serr != nil || st.StreamSeq != seq, nil
	}
	return false, err
}
