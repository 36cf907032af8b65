package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// How a waiting submit reports a run that stays queued: the first look
// comes soon, so a submit to a pool without workers says so within seconds
// instead of waiting in silence; later lines come every queueReportEvery.
var (
	queueFirstLook   = 1500 * time.Millisecond
	queueReportEvery = 10 * time.Second
)

// errNoWorker ends a waiting submit whose pool no live worker serves.
type errNoWorker struct{ pool, id string }

func (e errNoWorker) Error() string {
	return fmt.Sprintf("no live worker serves pool %s (workers announce their pools in the %s bucket): run %s stays queued until one starts, and is removed if none takes it within %s's max age (the workers' --runs-max-age, 7 days by default); "+
		"follow it later with `jetcrew watch %s`, or give --keep-waiting to wait for one", e.pool, messages.BucketWorkers, e.id, messages.StreamRuns, e.id)
}

// syncWriter serialises writes of the run printer and the queue reporter.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// Write writes p to the underlying writer under the lock.
func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// reportQueued runs while a submitted run is followed, until ctx ends or the
// run leaves the queued state: it writes the run's age in the queue and its
// pool's depth to w (unless quiet), and, unless keepWaiting, stops the follow
// with errNoWorker (through stop) as soon as no live worker serves the pool.
func reportQueued(ctx context.Context, d *dispatcher.Dispatcher, id, pool string, keepWaiting, quiet bool, w io.Writer, stop context.CancelCauseFunc) {
	submitted := time.Now()
	t := time.NewTimer(queueFirstLook)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := d.Status(ctx, id)
		if err == nil && st.State != messages.StateQueued {
			return // taken: the lifecycle lines go on
		}
		if st.QueuedAt.IsZero() {
			// No worker took it yet, so it has no state: its age
			// counts from the submit.
			st.QueuedAt = submitted
		}
		serving, unsure, err := d.PoolWorkers(ctx, pool)
		if err == nil && serving+unsure == 0 && !keepWaiting {
			stop(errNoWorker{pool: pool, id: id})
			return
		}
		if !quiet {
			fmt.Fprintln(w, "--- "+describeQueued(ctx, d, st, pool, serving+unsure))
		}
		t.Reset(queueReportEvery)
	}
}

// describeQueued is the line about a queued run: its age, how many requests
// its pool holds, how many live workers serve it.
func describeQueued(ctx context.Context, d *dispatcher.Dispatcher, st messages.RunState, pool string, workers int) string {
	s := "queued"
	if !st.QueuedAt.IsZero() {
		s += fmt.Sprintf(" for %s", time.Since(st.QueuedAt).Round(time.Second))
	}
	if n, err := d.QueueDepth(ctx, pool); err == nil {
		s += fmt.Sprintf("; %d request(s) in pool %s", n, pool)
	}
	if workers == 0 {
		return s + "; no live worker serves the pool yet (waiting: --keep-waiting)"
	}
	return s + fmt.Sprintf("; %d live worker(s) serve it", workers)
}

// followQueued is follow for a run just submitted to pool: it reports the
// run while it stays queued (reportQueued), and turns a follow stopped for
// want of a worker into errNoWorker, exit code 1.
func (a submitCmds) followQueued(ctx context.Context, d *dispatcher.Dispatcher, id, pool string, keepWaiting, quiet bool) error {
	wctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	a.stderr = &syncWriter{w: a.stderr}
	done := make(chan struct{})
	go func() { // ends with wctx or once the run leaves the queue
		defer close(done)
		reportQueued(wctx, d, id, pool, keepWaiting, quiet, a.stderr, stop)
	}()
	err := a.follow(wctx, d.Events, id, quiet)
	stop(nil)
	<-done
	var nw errNoWorker
	if errors.As(context.Cause(wctx), &nw) && ctx.Err() == nil {
		return &exitError{code: exitFailure, err: nw}
	}
	return err
}
