package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/internal/origin"
	"github.com/jetcrew/jetcrew/messages"
)

// StreamMsg is one message FollowMessages read.
type StreamMsg struct {
	// Subject is the message's subject.
	Subject string
	// Header holds its headers; nil when it has none.
	Header nats.Header
	// Data is its body. The callback may keep it.
	Data []byte
	// Time is when the stream stored it.
	Time time.Time
	// Sequence is its sequence in the stream.
	Sequence uint64
}

// FollowMessages calls fn with every message of stream whose subject
// matches one of filters, from the first one stored, in stream order, then
// live as they are stored, until ctx ends or fn fails. It reads with an
// ephemeral ordered consumer, so read access to the stream is enough.
//
// It returns nil once ctx has ended, fn's error unchanged when fn fails,
// and an error wrapping ErrNotProvisioned when the stream does not exist.
func (es *Events) FollowMessages(ctx context.Context, stream string, filters []string, fn func(StreamMsg) error) error {
	if len(filters) == 0 {
		return errors.New("follow: no subject filter")
	}
	cons, err := es.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: filters,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("follow %s %v: %w", stream, filters, classify(err))
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("follow %s %v: %w", stream, filters, classify(err))
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("follow %s %v: %w", stream, filters, err)
		}
		sm := StreamMsg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}
		if meta, err := m.Metadata(); err == nil {
			sm.Time, sm.Sequence = meta.Timestamp, meta.Sequence.Stream
		}
		if err := fn(sm); err != nil {
			return err
		}
	}
}

// Follow calls fn with every event on JETCREW_EVENTS whose subject matches
// one of filters (jetcrew.events.<run_id>.> for one run's,
// jetcrew.events.*.coord for every coordination event), as FollowMessages
// reads them, each attempt's output in its Jetcrew-Seq order as Watch
// passes it. Unlike Watch it never ends by itself: a run's finished event
// is passed on like any other. A finished event whose body cannot be
// decoded is skipped, and so is an event the server relayed into the
// stream (another stream's RePublish, a source: origin.Relayed), which no
// worker published. Its errors are FollowMessages'.
func (es *Events) Follow(ctx context.Context, filters []string, fn func(WatchEvent) error) error {
	fn = newOutputOrder().wrap(fn)
	return es.FollowMessages(ctx, messages.StreamEvents, filters, func(m StreamMsg) error {
		if origin.Relayed(m.Header) {
			return nil
		}
		ev, err := parseStoredEvent(&jetstream.RawStreamMsg{Subject: m.Subject, Sequence: m.Sequence, Header: m.Header, Data: m.Data, Time: m.Time})
		if err != nil {
			return nil
		}
		return fn(ev)
	})
}
