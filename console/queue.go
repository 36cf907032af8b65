package console

import (
	"context"
	"errors"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// queue reads the requests waiting in JETCREW_RUNS for the pages' lists.
// It reads the first Config.QueueRead of them, oldest first, at most once
// per memoMaxAge (memo) however many pages show them.
type queue struct {
	d     *dispatcher.Dispatcher
	cache *cache
	// read is Config.QueueRead.
	read int
	last memo[queueRead]
}

// queueRead is one read of the queue: the requests read and how many
// JETCREW_RUNS holds.
type queueRead struct {
	reqs  []dispatcher.QueuedRequest
	total uint64
}

// queuedView is the queued runs as the pages show them.
type queuedView struct {
	// Runs are the runs no worker has taken, as queued states, oldest
	// first; each one's Reason says its place in its pool's queue.
	Runs []messages.RunState
	// Read is how many requests were read, Total how many JETCREW_RUNS
	// holds (taken ones still running included).
	Read  int
	Total uint64
	// Err is why the queue could not be read; nil when the stream does
	// not exist yet.
	Err error
}

// Capped reports whether the queue holds more requests than were read.
func (v queuedView) Capped() bool { return v.Total > uint64(v.Read) }

// queued returns the runs whose requests wait in JETCREW_RUNS and that no
// worker has taken yet (the cache has no state for them), read at most
// memoMaxAge ago.
func (q *queue) queued(ctx context.Context) queuedView {
	reqs, total, err := q.requests(ctx)
	return queuedView{Read: len(reqs), Total: total, Err: err, Runs: dispatcher.WaitingRuns(reqs, func(id string) bool {
		_, ok := q.cache.get(id)
		return ok
	})}
}

// requests returns the requests waiting in JETCREW_RUNS (the first
// Config.QueueRead, oldest first, replays included), how many the stream
// holds and why they could not be read, as read at most memoMaxAge ago.
// The slice is shared: read only.
func (q *queue) requests(ctx context.Context) ([]dispatcher.QueuedRequest, uint64, error) {
	v, err := q.last.get(ctx, func(ctx context.Context) (queueRead, error) {
		reqs, total, err := q.d.Requests(ctx, q.read)
		if errors.Is(err, dispatcher.ErrNotProvisioned) {
			err = nil
		}
		return queueRead{reqs: reqs, total: total}, err
	})
	return v.reqs, v.total, err
}
