package dispatcher

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// RunUpdate is one change of the jetcrew-runs bucket, as WatchRuns hands it
// to its callback.
type RunUpdate struct {
	// ID is the run id (the bucket key); empty on the Synced marker.
	ID string
	// State is the run's new state; zero when Deleted.
	State messages.RunState
	// Deleted is true when the run's state was deleted or purged.
	Deleted bool
	// Synced is true on the one marker update WatchRuns sends after the
	// last state stored when it started: every update before it was a
	// stored state, every one after it a live change.
	Synced bool
}

// WatchRuns calls fn with the state of every run stored in the jetcrew-runs
// bucket, then the Synced marker, then every change as it happens, until
// ctx ends. A state that cannot be decoded is skipped. It returns an error
// wrapping ErrNotProvisioned when the bucket does not exist, and nil once
// ctx has ended; fn runs on WatchRuns' goroutine, one update at a time.
func (d *Dispatcher) WatchRuns(ctx context.Context, fn func(RunUpdate)) error {
	kv, err := d.runsBucket(ctx)
	if err != nil {
		return fmt.Errorf("watch runs: %w", err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch runs: %w", classify(err))
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("watch runs: the watch of bucket %s ended", messages.BucketRuns)
			}
			if e == nil {
				fn(RunUpdate{Synced: true})
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				fn(RunUpdate{ID: e.Key(), Deleted: true})
				continue
			}
			st, err := decodeState(e.Key(), e.Value())
			if err != nil {
				continue
			}
			fn(RunUpdate{ID: e.Key(), State: st})
		}
	}
}
