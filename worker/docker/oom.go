package docker

import (
	"context"
	"sync"
	"time"

	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/jetcrew/jetcrew/worker/jail"
)

// oomWatcher follows the engine's "oom" container events for jetcrew's
// containers. State.OOMKilled alone is not enough: when the engine handles a
// container's exit before its OOM notification, the exit can overwrite the
// flag (seen on Engine 20.10: a container the kernel OOM-killed, inspected
// seconds later, said OOMKilled false), while the "oom" event is still
// emitted. Wait consults both.
type oomWatcher struct {
	mu   sync.Mutex
	seen map[string]time.Time // container id → when its oom event came

	cancel context.CancelFunc
	done   chan struct{}
}

// oomMemory is how long an oom event is remembered.
const oomMemory = 10 * time.Minute

// watchOOM subscribes to the engine's oom events for containers labelled
// jail.LabelManaged, resubscribing after an error, until stop is called.
func (r *Runtime) watchOOM() {
	ctx, cancel := context.WithCancel(context.Background())
	w := &oomWatcher{seen: map[string]time.Time{}, cancel: cancel, done: make(chan struct{})}
	r.oom = w
	go func() {
		// Ends when Close cancels ctx.
		defer close(w.done)
		opts := events.ListOptions{Filters: filters.NewArgs(
			filters.Arg("type", string(events.ContainerEventType)),
			filters.Arg("event", string(events.ActionOOM)),
			filters.Arg("label", jail.LabelManaged+"=true"),
		)}
		for ctx.Err() == nil {
			msgs, errs := r.cli.Events(ctx, opts)
		stream:
			for {
				select {
				case <-ctx.Done():
					return
				case m := <-msgs:
					w.record(m.Actor.ID)
				case err := <-errs:
					if ctx.Err() == nil {
						r.log.Warn().Err(err).Msg("docker oom event stream ended; resubscribing")
					}
					break stream
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
}

func (w *oomWatcher) record(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	for k, t := range w.seen {
		if now.Sub(t) > oomMemory {
			delete(w.seen, k)
		}
	}
	w.seen[id] = now
}

// oomSeen reports whether the engine sent an oom event for container id.
func (r *Runtime) oomSeen(id string) bool {
	if r.oom == nil {
		return false
	}
	r.oom.mu.Lock()
	defer r.oom.mu.Unlock()
	_, ok := r.oom.seen[id]
	return ok
}

func (w *oomWatcher) stop() {
	if w == nil {
		return
	}
	w.cancel()
	<-w.done
}
