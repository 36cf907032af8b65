package runner

import (
	"context"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/runstate"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// outputWindow is the most output messages of one run published and not
// yet acknowledged by the server (messages.MaxOutputChunk bytes each, so at
// most 2 MiB per run). A run writing faster than the server stores waits
// for the oldest acknowledgement: its container's writes block, the worker's
// memory does not grow. Acknowledged publishes are forgotten at once.
const outputWindow = 64

// admitLocked returns how many bytes of an n-byte write fit in the run's
// output budget, and counts the rest as dropped.
func (o *outputPublisher) admitLocked(n int) int {
	if o.budget <= 0 {
		return n
	}
	room := max(0, o.budget-o.accepted)
	if int64(n) <= room {
		o.accepted += int64(n)
		return n
	}
	o.accepted += room
	o.dropped += int64(n) - room
	return int(room)
}

// waitWindowLocked forgets the acknowledged publishes at the front of the
// window and, while the window is full, waits for the oldest one (a failed
// one is published again, synchronously, until acknowledged).
func (o *outputPublisher) waitWindowLocked() {
	for len(o.futures) > 0 {
		f := o.futures[0]
		if len(o.futures) < outputWindow {
			// Ok delivers its ack once: a future taken here is done.
			select {
			case <-f.Ok():
			default:
				return // the oldest is still in flight and there is room
			}
		} else if err := o.settle(context.Background(), f); err != nil && o.err == nil {
			o.err = err
		}
		o.futures[0] = nil
		o.futures = o.futures[1:]
	}
}

// settle waits for f's acknowledgement; a publish that failed is published
// again (Nats-Msg-Id deduplicates one that had in fact been stored).
func (o *outputPublisher) settle(ctx context.Context, f jetstream.PubAckFuture) error {
	select {
	case <-f.Ok():
		return nil
	case <-f.Err():
		m := f.Msg()
		return runstate.RetryOp(ctx, func(ctx context.Context) error { _, err := o.js.PublishMsg(ctx, m); return err })
	case <-ctx.Done():
		return ctx.Err()
	}
}

// droppedBytes returns how many bytes of output the budget dropped.
func (o *outputPublisher) droppedBytes() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.dropped
}

// noteDropped records in the run's state st, and logs to log, the output
// the budget dropped.
func (o *outputPublisher) noteDropped(st *messages.RunState, log zerolog.Logger) {
	if d := o.droppedBytes(); d > 0 {
		st.OutputDroppedBytes = d
		log.Warn().Int64("dropped_bytes", d).Int64("published_bytes", st.OutputBytes).
			Msg("output past the profile's max_output_mib was dropped")
	}
}
