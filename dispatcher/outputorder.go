package dispatcher

import (
	"slices"

	"github.com/jetcrew/jetcrew/messages"
)

// maxHeldOutput is the most output events of one attempt held back while
// the one with the next Jetcrew-Seq is missing: a worker has at most this
// many publishes in flight (its outputWindow), so a chunk it had to publish
// again comes at most that many chunks late; one that never comes (its
// publish failed for good, or it expired) is given up on past it.
const maxHeldOutput = 64

// orderKey is one attempt of one run.
type orderKey struct {
	run     string
	attempt int
}

// outputOrder passes events on with each attempt's output in its
// Jetcrew-Seq order (messages.HeaderSeq), the order the worker read stdout
// and stderr in: an output event stored ahead of a chunk published again
// after a failure waits for it. Any other event of the run first releases
// what waits, so nothing waits past the finished event. Output without
// the header (an older worker's) passes at once, in stream order. Not safe
// for concurrent use.
type outputOrder struct {
	next map[orderKey]uint64       // the Seq to pass next; absent: 1
	held map[orderKey][]WatchEvent // waiting, sorted by Seq
}

func newOutputOrder() *outputOrder {
	return &outputOrder{next: map[orderKey]uint64{}, held: map[orderKey][]WatchEvent{}}
}

// wrap returns fn behind o; nil stays nil.
func (o *outputOrder) wrap(fn func(WatchEvent) error) func(WatchEvent) error {
	if fn == nil {
		return nil
	}
	return func(ev WatchEvent) error { return o.pass(ev, fn) }
}

// pass hands ev, and whatever it lets go, to fn in order.
func (o *outputOrder) pass(ev WatchEvent, fn func(WatchEvent) error) error {
	if ev.Type != messages.EventOutput {
		if err := o.release(ev.RunID, fn); err != nil {
			return err
		}
		if ev.Type == messages.EventStarted || ev.Type == messages.EventFinished {
			// A replay's attempts count from 1 again, and so do their Seqs.
			for k := range o.next {
				if k.run == ev.RunID {
					delete(o.next, k)
				}
			}
		}
		return fn(ev)
	}
	if ev.Seq == 0 {
		return fn(ev)
	}
	k := orderKey{ev.RunID, ev.Attempt}
	next := max(o.next[k], 1)
	if ev.Seq < next {
		return fn(ev) // given up on, or a repeat: late is better than never
	}
	held := o.held[k]
	i, _ := slices.BinarySearchFunc(held, ev.Seq, func(e WatchEvent, s uint64) int { return cmpSeq(e.Seq, s) })
	held = slices.Insert(held, i, ev)
	for len(held) > 0 && (held[0].Seq <= next || len(held) > maxHeldOutput) {
		e := held[0]
		held[0] = WatchEvent{}
		held = held[1:]
		next = max(next, e.Seq+1)
		if err := fn(e); err != nil {
			o.store(k, next, held)
			return err
		}
	}
	o.store(k, next, held)
	return nil
}

// store keeps what pass left for attempt k.
func (o *outputOrder) store(k orderKey, next uint64, held []WatchEvent) {
	o.next[k] = next
	if len(held) == 0 {
		delete(o.held, k)
	} else {
		o.held[k] = held
	}
}

// release passes every held output event of run to fn, attempt by attempt,
// each in Seq order.
func (o *outputOrder) release(run string, fn func(WatchEvent) error) error {
	var keys []orderKey
	for k := range o.held {
		if k.run == run {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b orderKey) int { return a.attempt - b.attempt })
	for _, k := range keys {
		held := o.held[k]
		delete(o.held, k)
		for _, e := range held {
			o.next[k] = max(o.next[k], e.Seq+1)
			if err := fn(e); err != nil {
				return err
			}
		}
	}
	return nil
}

func cmpSeq(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
