package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nkeys"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// maxAttempts bounds submit --attempts.
const maxAttempts = 16

// attemptsPlan is what submit --attempts publishes: the group and one
// encoded request per attempt, each with its own run id and profile.
type attemptsPlan struct {
	group string
	encs  []dispatcher.Encoded
}

// planAttempts checks --attempts, --profiles, --id and --group and builds
// the attempts' requests, before anything connects: the group is --group,
// else --id, else a new run id; attempt i (from 1) is run GROUP-i (or
// ID-i), with profile --profiles[(i-1) mod len], else --profile. Every
// mistake is a usage error.
func (o submitOptions) planAttempts(prompt string) (attemptsPlan, error) {
	n := o.attempts
	if n == 0 {
		n = len(o.profiles)
	}
	if n < 1 || n > maxAttempts {
		return attemptsPlan{}, fmt.Errorf("--attempts %d: give 1 to %d", o.attempts, maxAttempts)
	}
	if len(o.profiles) > 0 && o.profileSet {
		return attemptsPlan{}, errors.New("--profile and --profiles both given: give one")
	}
	for _, p := range o.profiles {
		if p == "" {
			return attemptsPlan{}, fmt.Errorf("--profiles %q: an empty profile name", strings.Join(o.profiles, ","))
		}
	}
	base := o.id
	if base == "" {
		base = dispatcher.NewRunID()
	}
	suffix := fmt.Sprintf("-%d", n)
	if err := messages.ValidateToken("--id", base+suffix); err != nil {
		return attemptsPlan{}, fmt.Errorf("%w (with --attempts, the runs are ID-1 to ID%s)", err, suffix)
	}
	p := attemptsPlan{group: o.group}
	if p.group == "" {
		p.group = base
	}
	for i := range n {
		ao := o
		ao.id = fmt.Sprintf("%s-%d", base, i+1)
		ao.group = p.group
		if len(o.profiles) > 0 {
			ao.profile = o.profiles[i%len(o.profiles)]
		}
		req, err := ao.request(prompt)
		if err != nil {
			return attemptsPlan{}, err
		}
		enc, err := dispatcher.Encode(req)
		if err != nil {
			return attemptsPlan{}, err
		}
		p.encs = append(p.encs, enc)
	}
	return p, nil
}

// runAttempts is submit --attempts: N runs of one prompt on one workspace
// (uploaded once: every request names the same snapshot) in one group.
// It prints the run ids on stdout, one a line, and the group on stderr;
// with --wait it follows every run to its end, printing each one's
// finished line, and exits 0 only when every attempt succeeded.
func (a submitCmds) runAttempts(ctx context.Context, o submitOptions, prompt string, key nkeys.KeyPair) error {
	plan, err := o.planAttempts(prompt)
	if err != nil {
		return usageError(err)
	}
	if err := a.groupKeyed(o, plan.encs); err != nil {
		return usageError(err)
	}
	d, closeNATS, err := a.dispatcher(a.natsURL(o.url), "jetcrew submit")
	if err != nil {
		return err
	}
	defer closeNATS()
	ids, err := a.submitRequests(ctx, d, o, plan.encs, key, func(id string) { fmt.Fprintln(a.stdout, id) })
	if err != nil {
		if len(ids) > 0 {
			err = fmt.Errorf("%w (runs %s of group %s were submitted)", err, strings.Join(ids, ", "), plan.group)
		}
		return err
	}
	if !o.quiet {
		fmt.Fprintf(visible(a.stderr), "--- group %s: %d attempts (jetcrew compare %s)\n", plan.group, len(ids), plan.group)
	}
	if !o.wait {
		return nil
	}
	return a.followAttempts(ctx, d, ids, plan.encs[0].Request().Pool, o)
}

// followAttempts follows runs ids to their ends at once, writing a
// finished line per run to stderr as each ends (unless quiet) and, while
// the first is queued, the queue lines of a waiting submit (reportQueued:
// no live worker for the pool ends the wait with exit code 1). It returns
// an exit code 1 error unless every run succeeded.
func (a submitCmds) followAttempts(ctx context.Context, d *dispatcher.Dispatcher, ids []string, pool string, o submitOptions) error {
	wctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	stderr := &syncWriter{w: a.stderr}
	done := make(chan struct{})
	go func() { // ends with wctx or once the first run leaves the queue
		defer close(done)
		reportQueued(wctx, d, ids[0], pool, o.keepWaiting, o.quiet, stderr, stop)
	}()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed []string
		errs   []error
	)
	for _, id := range ids {
		wg.Go(func() {
			fin, err := d.Watch(wctx, id, func(dispatcher.WatchEvent) error { return nil })
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("run %s: %w", id, err))
				return
			}
			if fin.State != messages.StateSucceeded {
				failed = append(failed, id)
			}
			if !o.quiet {
				fmt.Fprintf(visible(stderr), "--- run %s finished: %s\n", id, describeOutcome(fin))
			}
		})
	}
	wg.Wait()
	stop(nil)
	<-done
	var nw errNoWorker
	if errors.As(context.Cause(wctx), &nw) && ctx.Err() == nil {
		return &exitError{code: exitFailure, err: nw}
	}
	if ctx.Err() != nil {
		return &exitError{code: exitInterrupted, err: errors.New("stopped following the attempts; they go on (jetcrew compare)")}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if len(failed) > 0 {
		return &exitError{code: exitFailure, err: fmt.Errorf("%d of %d attempts did not succeed: %s", len(failed), len(ids), strings.Join(failed, ", "))}
	}
	return nil
}
