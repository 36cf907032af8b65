package workertest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/jetcrew/jetcrew/worker/jail"
)

// logEntry is one write of a fake container's process, as kept.
type logEntry struct {
	stream string
	p      []byte
}

// outputLog is a fake container's output as the engine keeps it (its
// log, for Adopt) and the OutputFunc Start was given, which it calls as
// the behaviour writes until Detach. It keeps the last limit bytes
// (ContainerSpec.OutputLogBytes): past them the oldest writes are dropped
// whole, as the engine's log rotates its oldest file out; a limit of 0
// keeps nothing (Docker's log driver "none") and the container cannot be
// adopted.
type outputLog struct {
	limit int64

	mu      sync.Mutex
	entries []logEntry
	base    int   // writes dropped before entries[0]
	size    int64 // bytes in entries
	closed  bool  // the process exited: nothing more comes
	changed chan struct{}

	// attached is Start's OutputFunc, nil after Detach; calling it holds
	// deliver (a one-slot semaphore, so Detach can wait within a ctx).
	attached jail.OutputFunc
	deliver  chan struct{}
}

func newOutputLog(limit int64, attached jail.OutputFunc) *outputLog {
	return &outputLog{limit: limit, changed: make(chan struct{}), attached: attached, deliver: make(chan struct{}, 1)}
}

// write is the behaviour's OutputFunc: it keeps p and passes it to the
// attached OutputFunc, one call at a time.
func (l *outputLog) write(stream string, p []byte) {
	l.deliver <- struct{}{}
	defer func() { <-l.deliver }()
	l.mu.Lock()
	if l.limit > 0 && len(p) > 0 {
		l.entries = append(l.entries, logEntry{stream, slices.Clone(p)})
		l.size += int64(len(p))
		for l.size > l.limit {
			l.size -= int64(len(l.entries[0].p))
			l.entries = l.entries[1:]
			l.base++
		}
		l.notify()
	}
	f := l.attached
	l.mu.Unlock()
	if f != nil {
		f(stream, p)
	}
}

// notify wakes the followers; l.mu is held.
func (l *outputLog) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// close records that the process exited.
func (l *outputLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.notify()
}

// detach stops calls of the attached OutputFunc, waiting (within ctx)
// for one in progress.
func (l *outputLog) detach(ctx context.Context) error {
	select {
	case l.deliver <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	l.mu.Lock()
	l.attached = nil
	l.mu.Unlock()
	<-l.deliver
	return nil
}

// next returns the writes kept from the index from (past writes
// dropped, from the oldest kept), the index after them, and whether
// the process has exited and a channel closed at the next change.
func (l *outputLog) next(from int) (batch []logEntry, to int, closed bool, changed <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	from = max(from, l.base)
	batch = slices.Clone(l.entries[from-l.base:])
	return batch, from + len(batch), l.closed, l.changed
}

// follower passes an output log to an adopting Container's OutputFunc.
// Its goroutine ends once it passed everything the exited process wrote,
// or at stop.
type follower struct {
	quit     chan struct{}
	quitOnce sync.Once
	done     chan struct{}
}

func (f *follower) run(l *outputLog, out jail.OutputFunc) {
	defer close(f.done)
	i := 0
	for {
		batch, to, closed, changed := l.next(i)
		i = to
		for _, e := range batch {
			select {
			case <-f.quit:
				return
			default:
			}
			out(e.stream, e.p)
		}
		switch {
		case len(batch) > 0:
			continue
		case closed:
			return
		}
		select {
		case <-changed:
		case <-f.quit:
			return
		}
	}
}

// stop ends the follower and waits, within ctx, for its goroutine.
func (f *follower) stop(ctx context.Context) error {
	f.quitOnce.Do(func() { close(f.quit) })
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Adopt implements jail.Runtime on a container of this Runtime, by id or
// name, whichever Container (of whichever Worker) started it: output gets
// what its output log kept, from the start, then follows it until the
// process exits (or Detach, Remove). A container that does not exist
// (removed) wraps jail.ErrNotFound; one whose spec had no
// OutputLogBytes wraps jail.ErrNoOutputLog. Found's StartedAt is the
// container's creation, its Mounts the spec's bind and volume mounts as
// Start was given them.
func (r *Runtime) Adopt(_ context.Context, id string, output jail.OutputFunc) (jail.Container, jail.Found, error) {
	r.mu.Lock()
	p := r.containers[id]
	if p == nil {
		for _, c := range r.containers {
			if c.name == id {
				p = c
			}
		}
	}
	if p == nil {
		r.mu.Unlock()
		return nil, jail.Found{}, fmt.Errorf("adopt: no such container: %s: %w: %w", id, jail.ErrNotFound, jail.ErrPermanent)
	}
	found := jail.Found{ID: p.id, Name: p.name, ImageID: p.imageID, Labels: maps.Clone(p.spec.Labels),
		Running: !p.exited, StartedAt: p.created}
	if p.exited {
		found.Status = p.status
	}
	for _, m := range p.spec.Mounts {
		found.Mounts = append(found.Mounts, jail.Mount{Source: m.Source, Volume: m.Volume, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	r.mu.Unlock()
	if p.log.limit == 0 {
		return nil, found, fmt.Errorf("adopt %s: %w (no OutputLogBytes): %w", p.name, jail.ErrNoOutputLog, jail.ErrPermanent)
	}
	if output == nil {
		output = func(string, []byte) {}
	}
	f := &follower{quit: make(chan struct{}), done: make(chan struct{})}
	go f.run(p.log, output)
	return &Container{proc: p, follower: f}, found, nil
}

// Detach implements jail.Container: Start's OutputFunc is no longer
// called (a call in progress is waited for, within ctx), an adopting
// Container's follower ends; the container runs on.
func (c *Container) Detach(ctx context.Context) error {
	c.detached.Store(true)
	if c.follower != nil {
		return c.follower.stop(ctx)
	}
	return c.log.detach(ctx)
}
