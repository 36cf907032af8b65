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

// WatchEvent is one event of a run, as Watch hands it to its callback.
type WatchEvent struct {
	// Type is the event type: the last token of the event's subject.
	Type messages.EventType
	// Event is the decoded JSON body of every event but EventOutput (zero
	// for output, and for an event type this version does not know whose
	// body is not a messages.Event).
	Event messages.Event
	// Stream is messages.StreamStdout or messages.StreamStderr, on
	// EventOutput.
	Stream string
	// Offset is where Data starts within Stream, in bytes, on EventOutput.
	Offset int64
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
// one in stream order, output included. It returns the run's finished event
// after passing it to fn, so a run that is already over is replayed and
// returns at once.
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
	if err := messages.ValidateToken("run id", id); err != nil {
		return messages.Event{}, fmt.Errorf("watch: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	cons, err := d.js.OrderedConsumer(ctx, messages.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{messages.SubjectEventsAll(id)},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return messages.Event{}, fmt.Errorf("watch run %s: %w", id, classify(err))
	}
	it, err := cons.Messages()
	if err != nil {
		return messages.Event{}, fmt.Errorf("watch run %s: %w", id, classify(err))
	}

	// The reader ends when Next fails, which it does once ctx ends or the
	// iterator is stopped; the deferred function waits for that.
	msgs := make(chan jetstream.Msg)
	errc := make(chan error, 1)
	done := make(chan struct{})
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

	var (
		final   messages.RunState
		grace   *time.Timer
		graceC  <-chan time.Time
		pending uint64 // events left on the stream after the last one read
	)
	defer func() {
		if grace != nil {
			grace.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return messages.Event{}, fmt.Errorf("watch run %s: %w", id, ctx.Err())
		case err := <-errc:
			if ctx.Err() != nil {
				return messages.Event{}, fmt.Errorf("watch run %s: %w", id, ctx.Err())
			}
			return messages.Event{}, fmt.Errorf("watch run %s: %w", id, err)
		case m := <-msgs:
			ev, err := parseEvent(m)
			if err != nil {
				return messages.Event{}, fmt.Errorf("watch run %s: %w", id, err)
			}
			pending = 0
			if meta, err := m.Metadata(); err == nil {
				pending = meta.NumPending
			}
			if fn != nil {
				if err := fn(ev); err != nil {
					return messages.Event{}, err
				}
			}
			if ev.Type == messages.EventFinished {
				return ev.Event, nil
			}
		case e, ok := <-updates:
			if !ok {
				updates = nil
				continue
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			st, err := decodeState(id, e.Value())
			if err != nil || !st.State.Final() {
				continue
			}
			final = st
			if grace == nil {
				grace = time.NewTimer(d.finishedGrace)
				graceC = grace.C
			}
		case <-graceC:
			if pending > 0 {
				// Still catching up: the finished event may be among the
				// events not yet read.
				grace.Reset(d.finishedGrace)
				continue
			}
			ev := eventFromState(final)
			if fn != nil {
				we := WatchEvent{Type: ev.Type, Event: ev, Attempt: ev.Attempt, Time: ev.Time, FromState: true}
				if err := fn(we); err != nil {
					return messages.Event{}, err
				}
			}
			return ev, nil
		}
	}
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
	subj := m.Subject()
	ev := WatchEvent{
		Type: messages.EventType(subj[strings.LastIndexByte(subj, '.')+1:]),
		Data: m.Data(),
	}
	if meta, err := m.Metadata(); err == nil {
		ev.Time = meta.Timestamp
		ev.Sequence = meta.Sequence.Stream
	}
	h := m.Headers()
	ev.Attempt, _ = strconv.Atoi(h.Get(messages.HeaderAttempt))
	if ev.Type == messages.EventOutput {
		ev.Stream = h.Get(messages.HeaderStream)
		ev.Offset, _ = strconv.ParseInt(h.Get(messages.HeaderOffset), 10, 64)
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
