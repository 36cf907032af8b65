package runner

import (
	"context"
	"sync"
	"time"

	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/runstate"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// control is a run's container and the stop asked for it: the first stop
// wins, and a stop asked for before the container exists happens as soon
// as it does.
type control struct {
	mu        sync.Mutex
	container jail.Container
	stop      *stage.Stop
}

// current returns the run's container, nil before it started.
func (c *control) current() jail.Container {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.container
}

// stopped returns the stop a stage asked for, nil when none did.
func (c *control) stopped() *stage.Stop {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stop
}

// setContainer records the run's started container, and stops it at once
// when a stage asked for that while it was starting.
func (r *run) setContainer(c jail.Container) {
	r.ctl.mu.Lock()
	r.ctl.container = c
	stop := r.ctl.stop
	r.ctl.mu.Unlock()
	if stop != nil {
		r.stopContainer(c)
	}
}

// stopFor stops the run's container, once, for a stage's stop: the first
// one wins. Asked before the container is known, the stop happens as soon
// as it is.
func (r *run) stopFor(stop stage.Stop) {
	r.ctl.mu.Lock()
	if r.ctl.stop != nil {
		r.ctl.mu.Unlock()
		return
	}
	r.ctl.stop = &stop
	c := r.ctl.container
	r.ctl.mu.Unlock()
	r.log.Warn().Str("state", string(stop.State)).Msg(stop.Reason)
	if c != nil {
		r.stopContainer(c)
	}
}

// stopContainer stops c in the background (Runner.stopAsync).
func (r *run) stopContainer(c jail.Container) {
	r.e.stopAsync(c, r.log, "stop container")
}

// watch calls the run's Checkers until the returned function is called,
// every CheckEvery (the shortest any asks for). A round that finds several
// stops takes the most overdue; one whose stage's part of the record
// changed writes the record (the run's own goroutine is in Wait meanwhile,
// so this write is alone). A run without Checkers costs no timer.
func (r *run) watch() func() {
	var checkers []stage.Checker
	every := time.Duration(0)
	for _, s := range r.stages {
		if c, ok := s.(stage.Checker); ok {
			checkers = append(checkers, c)
			if d := c.CheckEvery(); every == 0 || d < every {
				every = d
			}
		}
	}
	if len(checkers) == 0 {
		return func() {}
	}
	return tickUntilStopped(every, func() {
		now := time.Now()
		var stop *stage.Stop
		changed := false
		for _, c := range checkers {
			s, ch := c.Check(now)
			changed = changed || ch
			if s != nil && (stop == nil || s.Overdue > stop.Overdue) {
				stop = s
			}
		}
		if changed {
			ctx, cancel := context.WithTimeout(context.Background(), runstate.OpMaxElapsed)
			if err := r.rec.put(ctx); err != nil {
				r.log.Warn().Err(err).Msg("record the run's progress")
			}
			cancel()
		}
		if stop != nil {
			r.stopFor(*stop)
		}
	})
}

// tickUntilStopped calls f every interval (counted from the end of the
// previous call) until the returned function is called; that function
// waits for a call in progress to end. It runs on a timer, not a goroutine
// of its own: most runs end before the first tick, and a goroutine and a
// ticker per run would be a cost of every run.
func tickUntilStopped(interval time.Duration, f func()) (stop func()) {
	var mu sync.Mutex
	stopped := false
	mu.Lock()
	defer mu.Unlock()
	var t *time.Timer
	t = time.AfterFunc(interval, func() {
		// Ends after one call of f; the timer starts the next.
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		f()
		t.Reset(interval)
	})
	return func() {
		mu.Lock() // waits for a call of f in progress
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}
