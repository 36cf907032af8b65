package dispatcher

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// Follow calls fn with every event on JETCREW_EVENTS whose subject matches
// one of filters (jetcrew.events.<run_id>.> for one run's,
// jetcrew.events.*.coord for every coordination event), from the first one
// stored, in stream order, then live as they are stored, until ctx ends or
// fn fails. It reads with an ephemeral ordered consumer, as Watch does, but
// never ends by itself: a run's finished event is passed on like any other.
//
// It returns nil once ctx has ended, fn's error unchanged when fn fails,
// and an error wrapping ErrNotProvisioned when the stream does not exist.
func (d *Dispatcher) Follow(ctx context.Context, filters []string, fn func(WatchEvent) error) error {
	if len(filters) == 0 {
		return errors.New("follow: no subject filter")
	}
	cons, err := d.js.OrderedConsumer(ctx, messages.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: filters,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("follow %v: %w", filters, classify(err))
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("follow %v: %w", filters, classify(err))
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("follow %v: %w", filters, err)
		}
		ev, err := parseEvent(m)
		if err != nil {
			continue // an undecodable finished event: shown as nothing
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
}
