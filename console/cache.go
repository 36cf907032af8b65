package console

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// runWatcher is what the cache needs of the dispatcher.
type runWatcher interface {
	WatchRuns(ctx context.Context, fn func(dispatcher.RunUpdate)) error
}

// cache holds the state of every run in the jetcrew-runs bucket, kept
// current by one KV watch, and fans changes out to the pages' live streams.
// Its size is the bucket's: the bucket's own limits (history 1, the
// worker's max age) cap it.
type cache struct {
	mu     sync.RWMutex
	runs   map[string]*cached
	seq    uint64        // counts the changes applied; cached.seq is the latest of a run's
	synced chan struct{} // closed once the stored states are loaded
	subs   map[chan messages.RunState]struct{}
	// loading holds the ids seen since the current watch began, until its
	// Synced marker: runs not among them were deleted while no watch ran.
	loading map[string]bool
}

// cached is one run's state and the cache sequence of its latest change.
type cached struct {
	st  messages.RunState
	seq uint64
	// text is dispatcher.SearchText(&st), made once per change so a
	// search of the runs list lowers no string per run.
	text string
}

func newCache() *cache {
	return &cache{
		runs:   make(map[string]*cached),
		synced: make(chan struct{}),
		subs:   make(map[chan messages.RunState]struct{}),
	}
}

// run follows the bucket with w until ctx ends, retrying after a failed
// watch (the bucket not provisioned yet, NATS away) every retry. onErr
// hears of a failure when it differs from the one before.
func (c *cache) run(ctx context.Context, w runWatcher, retry time.Duration, onErr func(error)) {
	last := ""
	for ctx.Err() == nil {
		c.mu.Lock()
		c.loading = map[string]bool{}
		c.mu.Unlock()
		err := w.WatchRuns(ctx, c.apply)
		if err != nil && err.Error() != last && onErr != nil {
			onErr(err)
		}
		if err != nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
	}
}

// apply records one update and passes a live change to every subscriber.
// A subscriber too slow to take it is dropped (its channel closed), and
// its page reconnects and starts again from the current states.
func (c *cache) apply(u dispatcher.RunUpdate) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.loading != nil && !u.Synced {
		c.loading[u.ID] = true
	}
	switch {
	case u.Synced:
		c.dropUnseen()
		select {
		case <-c.synced:
		default:
			close(c.synced)
		}
		return
	case u.Deleted:
		delete(c.runs, u.ID)
		return
	}
	c.seq++
	c.runs[u.ID] = &cached{st: u.State, seq: c.seq, text: dispatcher.SearchText(&u.State)}
	for ch := range c.subs {
		select {
		case ch <- u.State:
		default:
			delete(c.subs, ch)
			close(ch)
		}
	}
}

// dropUnseen forgets the runs the watch that just loaded did not report:
// their states were deleted while no watch ran. Called with mu held.
func (c *cache) dropUnseen() {
	if c.loading == nil {
		return
	}
	for id := range c.runs {
		if !c.loading[id] {
			delete(c.runs, id)
		}
	}
	c.loading = nil
}

// subscribe returns a channel of live state changes, the states that
// changed after cache sequence since (see current) and pass keep, and the
// function that ends the subscription. A page rendered at sequence since
// thus misses no change made before its live stream opened. The channel is
// closed when the subscriber falls behind or unsubscribes.
func (c *cache) subscribe(since uint64, keep func(*messages.RunState) bool) (<-chan messages.RunState, []messages.RunState, func()) {
	ch := make(chan messages.RunState, 256)
	var missed []messages.RunState
	c.mu.Lock()
	c.subs[ch] = struct{}{}
	if since < c.seq {
		for _, e := range c.runs {
			if e.seq > since && keep(&e.st) {
				missed = append(missed, e.st)
			}
		}
	}
	c.mu.Unlock()
	// Oldest first: a page prepending each one ends with the newest on top.
	slices.SortFunc(missed, func(a, b messages.RunState) int { return dispatcher.Newer(&b, &a) })
	return ch, missed, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if _, ok := c.subs[ch]; ok {
			delete(c.subs, ch)
			close(ch)
		}
	}
}

// get returns the state of run id.
func (c *cache) get(id string) (messages.RunState, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.runs[id]
	if !ok {
		return messages.RunState{}, false
	}
	return e.st, true
}

// filter returns the states for which keep is true, newest first (by queue
// time, then id). The states are shared with the cache: read only.
func (c *cache) filter(keep func(*messages.RunState) bool) []*messages.RunState {
	c.mu.RLock()
	out := make([]*messages.RunState, 0, 64)
	for _, e := range c.runs {
		if keep(&e.st) {
			out = append(out, &e.st)
		}
	}
	c.mu.RUnlock()
	slices.SortFunc(out, dispatcher.Newer)
	return out
}

// filterRuns returns the states f matches, newest first, as filter does;
// its search reads each run's search text made when the run changed.
func (c *cache) filterRuns(f dispatcher.RunFilter) []*messages.RunState {
	if f.Search == "" {
		return c.filter(f.Match)
	}
	needle := strings.ToLower(f.Search)
	c.mu.RLock()
	out := make([]*messages.RunState, 0, 64)
	for _, e := range c.runs {
		if f.MatchText(&e.st, e.text, needle) {
			out = append(out, &e.st)
		}
	}
	c.mu.RUnlock()
	slices.SortFunc(out, dispatcher.Newer)
	return out
}

// each calls fn with every state, under the read lock: fn must not block.
func (c *cache) each(fn func(*messages.RunState)) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, e := range c.runs {
		fn(&e.st)
	}
}

// current returns the cache sequence: the number of changes applied.
func (c *cache) current() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.seq
}
