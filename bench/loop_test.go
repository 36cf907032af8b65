//go:build bench

package bench

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// submitAll calls submit count times from noopSubmitters goroutines and
// returns when all have returned; a goroutine whose call fails reports it
// and stops.
func submitAll(t *testing.T, count int, submit func() error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range noopSubmitters {
		wg.Go(func() {
			for next.Add(1) <= int64(count) {
				if err := submit(); err != nil {
					t.Errorf("submit: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// timedLoop runs a warm-up round (noopWarmup items) of round1, and returns
// the function throughput takes turns with: one round of n items, with a
// CPU profile into prof unless prof is empty, its elapsed time and the
// process CPU per item (unit, singular) logged under label, and items per
// second returned.
func timedLoop(t *testing.T, label, unit string, n int, round1 func(count int) time.Duration) func(prof string) float64 {
	t.Helper()
	round1(noopWarmup)
	return func(prof string) float64 {
		stop := cpuProfile(t, prof)
		cpu0 := processCPU(t)
		elapsed := round1(n)
		cpu := processCPU(t) - cpu0
		stop()
		t.Logf("%s: %d %ss in %s, process CPU %s (%.0f µs per %s)", label, n, unit, elapsed.Round(time.Millisecond),
			cpu.Round(time.Millisecond), float64(cpu.Microseconds())/float64(n), unit)
		return round(float64(n)/elapsed.Seconds(), 1)
	}
}

// pulledLoop is a bare JetStream loop on cons: noopConcurrency pullers,
// until the test ends, each fetch one message at a time and pass it to
// handle (which acks it); a round has submitAll call submit count times
// and ends when handle has returned count times, or, when finished is
// set, when it has been called count times (a watcher of the items'
// finished events, as the no-op loop watches its runs'). It returns
// timedLoop's function for rounds of n items.
func pulledLoop(t *testing.T, label, unit string, n int, cons jetstream.Consumer, submit func() error, handle func(context.Context, jetstream.Msg) error, finished *func()) func(prof string) float64 {
	t.Helper()
	var handled, seen, target atomic.Int64
	done := make(chan struct{}, 1)
	if finished != nil {
		*finished = func() {
			if seen.Add(1) == target.Load() {
				done <- struct{}{}
			}
		}
	}
	pctx, stopPullers := context.WithCancel(context.Background())
	var pullers sync.WaitGroup
	for range noopConcurrency {
		pullers.Go(func() {
			for pctx.Err() == nil {
				fctx, cancel := context.WithTimeout(pctx, 5*time.Second)
				batch, err := cons.Fetch(1, jetstream.FetchContext(fctx))
				if err != nil {
					cancel()
					continue
				}
				for m := range batch.Messages() {
					if err := handle(fctx, m); err != nil && pctx.Err() == nil {
						t.Errorf("%s: %v", label, err)
					}
					if handled.Add(1) == target.Load() && finished == nil {
						done <- struct{}{}
					}
				}
				cancel()
			}
		})
	}
	t.Cleanup(func() { stopPullers(); pullers.Wait() })
	return timedLoop(t, label, unit, n, func(count int) time.Duration {
		handled.Store(0)
		seen.Store(0)
		target.Store(int64(count))
		start := time.Now()
		submitAll(t, count, submit)
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s: only %d of %d %ss handled", label, handled.Load(), count, unit)
		}
		return time.Since(start)
	})
}
