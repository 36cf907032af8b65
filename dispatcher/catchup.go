package dispatcher

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/internal/origin"
	"github.com/jetcrew/jetcrew/messages"
)

// maxCatchUp bounds the events readMissed reads one by one.
const maxCatchUp = 100000

// readMissed reads, from the JETCREW_EVENTS stream leader, the events of run
// id after sequence after that Watch's consumer has not delivered, hands
// each to fn as the consumer would have, and returns the finished event
// among them that ends the watch (see watch: the first after a replay, else
// one belonging to the final state st). ok is false when there is none: the
// finished event is really gone.
//
// Watch calls it before it makes a finished event from the run's final
// state: a consumer placed on a node still catching up after a restart can
// stay silent for a while, and an event that was only not read yet must not
// be reported gone. It asks the stream leader (the JetStream message-get
// API, not a direct get, which any replica may answer from behind).
func (es *Events) readMissed(ctx context.Context, id string, after uint64, from watchFrom, st messages.RunState, fn func(WatchEvent) error) (messages.Event, bool, error) {
	var fin *messages.Event
	next := max(after+1, from.afterEvent+1)
	for range maxCatchUp {
		m, err := es.leaderGet(ctx, next, messages.SubjectEventsAll(id))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return messages.Event{}, false, err
		}
		next = m.Sequence + 1
		if origin.Relayed(m.Header) {
			continue // no worker published it
		}
		ev, err := parseStoredEvent(m)
		if err != nil {
			return messages.Event{}, false, err
		}
		if fn != nil {
			if err := fn(ev); err != nil {
				return messages.Event{}, false, err
			}
		}
		switch {
		case ev.Type == messages.EventFinished && from.requestSeq != 0:
			return ev.Event, true, nil
		case ev.Type == messages.EventFinished:
			e := ev.Event
			fin = &e
		case ev.Type == messages.EventStarted:
			fin = nil
		}
	}
	if fin != nil && finishOf(st, *fin) {
		return *fin, true, nil
	}
	return messages.Event{}, false, nil
}

// leaderGet returns the first message of JETCREW_EVENTS at or after seq on
// subject, asked of the stream leader. The error wraps jetstream.ErrMsgNotFound
// when there is none.
func (es *Events) leaderGet(ctx context.Context, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	return origin.Get(ctx, es.js.Conn(), messages.StreamEvents, seq, subject, "")
}
