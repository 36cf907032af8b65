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

// service is a piece of the worker's background work: Run works until ctx
// ends, then returns. The Worker (the composition root) starts each in its
// own goroutine and waits for all of them on Stop.
type service interface {
	Run(ctx context.Context)
}

// runServices runs each service in its own goroutine, counted in wg.
func runServices(ctx context.Context, wg *sync.WaitGroup, svcs ...service) {
	for _, s := range svcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.Run(ctx)
		}()
	}
}

// puller is the pull loop: slots goroutines, each pulling one request,
// handling it, and pulling again, so the worker never holds more requests
// than it can run.
type puller struct {
	cons   jetstream.Consumer
	slots  int
	wait   time.Duration // one pull request's wait
	handle func(ctx context.Context, msg jetstream.Msg)
	log    zerolog.Logger
}

// Run pulls until fetchCtx ends and returns once every slot's run in flight
// has ended. runsCtx aborts those runs (they hand their requests back).
func (p *puller) Run(fetchCtx, runsCtx context.Context) {
	var wg sync.WaitGroup
	for range p.slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.slot(fetchCtx, runsCtx)
		}()
	}
	wg.Wait()
}

// slot is one run slot.
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

// heartbeat keeps the worker's key in the workers bucket fresh.
type heartbeat struct {
	interval time.Duration
	beat     func(ctx context.Context) error
	log      zerolog.Logger
}

// Run beats every interval until ctx ends.
func (h *heartbeat) Run(ctx context.Context) {
	every(ctx, h.interval, func() {
		if err := h.beat(ctx); err != nil && ctx.Err() == nil {
			h.log.Warn().Err(err).Msg("heartbeat failed")
		}
	})
}

// deadLetterer moves each request named by a MaxDeliver advisory to the
// dead-letter stream (see onMaxDeliver).
type deadLetterer struct {
	cons  jetstream.Consumer
	wait  time.Duration // one pull request's wait
	move  func(ctx context.Context, advisory []byte) error
	retry time.Duration // delay before an advisory that failed comes back
	log   zerolog.Logger
}

// Run pulls advisories until ctx ends.
func (d *deadLetterer) Run(ctx context.Context) {
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, d.wait)
		batch, err := d.cons.Fetch(1, jetstream.FetchContext(pctx))
		if err != nil {
			cancel()
			sleepCtx(ctx, time.Second)
			continue
		}
		for m := range batch.Messages() {
			if err := d.move(ctx, m.Data()); err != nil {
				d.log.Warn().Err(err).Msg("move exhausted request to the dead-letter stream; retrying")
				_ = m.NakWithDelay(d.retry)
				continue
			}
			_ = m.Ack()
		}
		cancel()
	}
}

// cancelListener answers cancel requests (queue group: one worker decides)
// and internal stop requests (every worker: the one holding the run stops
// it); see subscribeControl.
type cancelListener struct {
	unsubscribe func()
}

// Run holds the subscriptions until ctx ends, then drains them.
func (c *cancelListener) Run(ctx context.Context) {
	<-ctx.Done()
	c.unsubscribe()
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
