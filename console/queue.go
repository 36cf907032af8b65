package console

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// queueMaxAge is how long one read of JETCREW_RUNS's requests serves the
// pages: however many pages are open, the console reads the queue at most
// once per queueMaxAge.
const queueMaxAge = time.Second

// queueReadTimeout bounds one read of the queue.
const queueReadTimeout = 3 * time.Second

// queue is the latest read of the requests waiting in JETCREW_RUNS: the
// first Config.QueueRead of them, oldest first.
type queue struct {
	mu    sync.Mutex
	at    time.Time
	reqs  []dispatcher.QueuedRequest
	total uint64
	err   error
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
// queueMaxAge ago.
func (c *Console) queued(ctx context.Context) queuedView {
	reqs, total, err := c.requests(ctx)
	return queuedView{Read: len(reqs), Total: total, Err: err, Runs: dispatcher.WaitingRuns(reqs, func(id string) bool {
		_, ok := c.cache.get(id)
		return ok
	})}
}

// requests returns the requests waiting in JETCREW_RUNS (the first
// Config.QueueRead, oldest first, replays included), how many the stream
// holds and why they could not be read, as read at most queueMaxAge ago.
// The slice is shared: read only.
func (c *Console) requests(ctx context.Context) ([]dispatcher.QueuedRequest, uint64, error) {
	q := &c.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	if time.Since(q.at) >= queueMaxAge {
		rctx, cancel := context.WithTimeout(ctx, queueReadTimeout)
		q.reqs, q.total, q.err = c.d.Requests(rctx, c.cfg.QueueRead)
		cancel()
		if errors.Is(q.err, dispatcher.ErrNotProvisioned) {
			q.err = nil
		}
		q.at = time.Now()
	}
	return q.reqs, q.total, q.err
}
