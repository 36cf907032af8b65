package worker

import (
	"context"
	"errors"
)

// part is a long-lived piece of the worker, started in the order the
// worker declares (Worker.parts) and stopped in the reverse order (the
// model is River's startstop services and controller-runtime's runnable
// groups).
//
// Start starts it and returns once it runs, or an error when it cannot:
// the worker then stops the parts started before it, in reverse, and does
// not start. Its work goes on until Stop, whatever becomes of Start's ctx,
// which bounds the start alone. Stop ends it and waits for what it
// started; ctx bounds only what a part may cut short (the runs in flight,
// handed back when it ends), and such a part then returns ctx's error.
// Stop is called once, and only after Start succeeded.
type part interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// namedPart is a part and its name, which the start order is checked by.
type namedPart struct {
	name string
	part
}

// lifecycle is a list of parts in start order and how many have started.
type lifecycle struct {
	parts   []namedPart
	started int
}

// start starts the parts in order. When one fails, it stops those started
// before it, in reverse, and returns the failure.
func (l *lifecycle) start(ctx context.Context) error {
	for _, p := range l.parts[l.started:] {
		if err := p.Start(ctx); err != nil {
			_ = l.stop(context.WithoutCancel(ctx))
			return err
		}
		l.started++
	}
	return nil
}

// stop stops the started parts in reverse order, each whatever the
// others returned, and returns their errors joined.
func (l *lifecycle) stop(ctx context.Context) error {
	var errs []error
	for ; l.started > 0; l.started-- {
		if err := l.parts[l.started-1].Stop(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// hooks is a part made of two functions, either of which may be nil.
type hooks struct {
	start, stop func(ctx context.Context) error
}

// Start calls the start function.
func (h hooks) Start(ctx context.Context) error {
	if h.start == nil {
		return nil
	}
	return h.start(ctx)
}

// Stop calls the stop function.
func (h hooks) Stop(ctx context.Context) error {
	if h.stop == nil {
		return nil
	}
	return h.stop(ctx)
}

// made is a part the stages part makes when it starts (compose: the
// egress proxies, the workspaces, the warm pool), looked up then.
type made func() part

// Start starts the part made.
func (m made) Start(ctx context.Context) error { return m().Start(ctx) }

// Stop stops the part made.
func (m made) Stop(ctx context.Context) error { return m().Stop(ctx) }
