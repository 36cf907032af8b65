package worker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// puller is the pull loop: slots goroutines, each pulling one request,
// handling it, and pulling again, so the worker never holds more requests
// than it can run. Start begins it; Stop stops fetching, and the runs in
// flight go on until inFlight's Stop waits for them (or hands them back).
type puller struct {
	cons   jetstream.Consumer
	slots  int
	wait   time.Duration // one pull request's wait
	handle func(ctx context.Context, msg jetstream.Msg)
	log    zerolog.Logger

	fetchCancel context.CancelFunc // stops fetching (Stop)
	runsCancel  context.CancelFunc // aborts the runs in flight: they hand their requests back (inFlight)
	done        chan struct{}      // closed once every slot's run in flight, and every adopted run, ended

	// mu guards open, set from Start to Stop: adopted runs may be
	// spawned (spawn) while it is.
	mu      sync.Mutex
	open    bool
	adopted sync.WaitGroup
	runsCtx context.Context
}

// Start begins pulling, one pull request per slot, until Stop. It returns
// nil.
func (p *puller) Start(ctx context.Context) error {
	ctx = context.WithoutCancel(ctx)
	fetchCtx, fetchCancel := context.WithCancel(ctx)
	runsCtx, runsCancel := context.WithCancel(ctx)
	p.fetchCancel, p.runsCancel, p.done = fetchCancel, runsCancel, make(chan struct{})
	p.mu.Lock()
	p.open, p.runsCtx = true, runsCtx
	p.mu.Unlock()
	go func() {
		defer close(p.done)
		defer p.adopted.Wait()
		var wg sync.WaitGroup
		for range p.slots {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.slot(fetchCtx, runsCtx)
			}()
		}
		wg.Wait()
	}()
	return nil
}

// Stop stops fetching: no new request is taken; it does not wait. It
// returns nil.
func (p *puller) Stop(context.Context) error {
	p.mu.Lock()
	p.open = false
	p.mu.Unlock()
	p.fetchCancel()
	return nil
}

// spawn runs an adopted run, run, beside the slots' runs, with their
// context: the worker's stop waits for it (inFlight) as for theirs. It
// reports false, running nothing, before Start and after Stop.
func (p *puller) spawn(run func(ctx context.Context)) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.open {
		return false
	}
	p.adopted.Add(1)
	go func() {
		defer p.adopted.Done()
		run(p.runsCtx)
	}()
	return true
}

// accepting reports whether spawn would run an adopted run.
func (p *puller) accepting() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

// slot is one run slot: it pulls until fetchCtx ends and returns once its
// run in flight has ended. runsCtx aborts that run (it hands its request
// back).
func (p *puller) slot(fetchCtx, runsCtx context.Context) {
	for fetchCtx.Err() == nil {
		pctx, cancel := context.WithTimeout(fetchCtx, p.wait)
		batch, err := p.cons.Fetch(1, jetstream.FetchContext(pctx))
		if err != nil {
			cancel()
			if fetchCtx.Err() != nil {
				return
			}
			p.log.Warn().Err(err).Msg("fetch failed; retrying in 1s")
			sleepCtx(fetchCtx, time.Second)
			continue
		}
		for msg := range batch.Messages() {
			p.handle(runsCtx, msg)
		}
		cancel()
		if err := batch.Error(); err != nil && fetchCtx.Err() == nil &&
			!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
			p.log.Warn().Err(err).Msg("fetch ended with an error")
			sleepCtx(fetchCtx, time.Second)
		}
	}
}

// inFlight is the runs the puller's slots have in flight, as a part: its
// Stop, after the puller's (no new request) and the warm pool's (no new
// warm start), waits for them to finish.
type inFlight struct {
	p *puller
	// leaving reports whether the worker stops leaving its runs to a
	// successor (Worker.Leave): they are then ended at once, their
	// containers running on.
	leaving func() bool
}

// Start does nothing: the runs start with the puller.
func (inFlight) Start(context.Context) error { return nil }

// Stop waits for the runs in flight to finish. When ctx ends first, the
// remaining runs are stopped and their requests handed back to the stream
// (Nak) for another worker, and Stop returns ctx's error once they are.
func (f inFlight) Stop(ctx context.Context) error {
	p := f.p
	if p.done == nil {
		return nil // never started
	}
	if f.leaving != nil && f.leaving() {
		p.runsCancel()
	}
	var err error
	select {
	case <-p.done:
	case <-ctx.Done():
		err = ctx.Err()
		p.runsCancel()
		<-p.done
	}
	p.runsCancel()
	return err
}

// loop runs one part's goroutine from its Start to its Stop.
type loop struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// start runs f in a goroutine under a context of its own, which stop
// cancels: ctx's values are kept, not its end (a part lives until Stop,
// whatever becomes of the context it was started with).
func (l *loop) start(ctx context.Context, f func(ctx context.Context)) {
	ctx, l.cancel = context.WithCancel(context.WithoutCancel(ctx))
	l.done = make(chan struct{})
	go func() {
		defer close(l.done)
		f(ctx)
	}()
}

// stop cancels the goroutine's context and waits for it to return; it is
// a no-op before start, and safe to call twice.
func (l *loop) stop() {
	if l.cancel == nil {
		return
	}
	l.cancel()
	<-l.done
}

// every calls f every interval until ctx ends.
func every(ctx context.Context, interval time.Duration, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
