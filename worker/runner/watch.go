package runner

import (
	"context"
	"sync"
	"time"

	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/runstate"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/rs/zerolog"
)

// control is a run's container and the stop asked for it: the first stop
// wins, and a stop asked for before the container exists happens as soon
// as it does.
type control struct {
	e   *Runner
	log zerolog.Logger

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

// set records the run's started container, and stops it at once when a
// stage asked for that while it was starting.
func (c *control) set(ctr jail.Container) {
	c.mu.Lock()
	c.container = ctr
	stop := c.stop
	c.mu.Unlock()
	if stop != nil {
		c.stopAsync(ctr)
	}
}

// stopFor stops the run's container, once, for a stage's stop: the first
// one wins. Asked before the container is known, the stop happens as soon
// as it is.
func (c *control) stopFor(stop stage.Stop) {
	c.mu.Lock()
	if c.stop != nil {
		c.mu.Unlock()
		return
	}
	c.stop = &stop
	ctr := c.container
	c.mu.Unlock()
	c.log.Warn().Str("state", string(stop.State)).Msg(stop.Reason)
	if ctr != nil {
		c.stopAsync(ctr)
	}
}

// stopAsync stops ctr in the background (Runner.stopAsync).
func (c *control) stopAsync(ctr jail.Container) {
	c.e.stopAsync(ctr, c.log, "stop container")
}

// stopAndWait stops ctr with the worker's grace period and waits for its
// exit.
func (c *control) stopAndWait(ctr jail.Container) (jail.ExitStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.e.cfg.StopGrace+30*time.Second)
	defer cancel()
	if err := ctr.Stop(ctx, c.e.cfg.StopGrace); err != nil {
		return jail.ExitStatus{Code: -1}, err
	}
	return ctr.Wait(ctx)
}

// remove removes ctr and reports whether it did, logging a failure (the
// reconciler retries).
func (c *control) remove(ctr jail.Container) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ctr.Remove(ctx); err != nil {
		c.log.Warn().Err(err).Str("container_id", shortID(ctr.ID())).Msg("remove container; the reconciler will retry")
		return false
	}
	return true
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
			r.ctl.stopFor(*stop)
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
