package worker

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/messages"
)

// DeriveRunID returns the run id of a request that carries none, derived from
// the stream message itself: a ULID whose time is the message's stream
// timestamp and whose entropy is its stream sequence. Every redelivery of the
// message, to any worker, yields the same id.
func DeriveRunID(meta *jetstream.MsgMetadata) string {
	var entropy [10]byte
	binary.BigEndian.PutUint64(entropy[2:], meta.Sequence.Stream)
	id, err := ulid.New(ulid.Timestamp(meta.Timestamp), bytesReader(entropy[:]))
	if err != nil {
		// Only a timestamp beyond the year 10889 fails.
		return "seq-" + strconv.FormatUint(meta.Sequence.Stream, 10)
	}
	return id.String()
}

type bytesReader []byte

func (b bytesReader) Read(p []byte) (int, error) { return copy(p, b), nil }

// run is one delivery of one request being handled.
type run struct {
	w     *Worker
	msg   jetstream.Msg
	meta  *jetstream.MsgMetadata
	req   messages.RunRequest
	state messages.RunState
	log   zerolog.Logger
}

// handle runs one delivered request to an outcome: ack (final state
// recorded), term (dead letter recorded) or nak (handed back for a retry).
// It never panics the worker on bad input.
func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		w.log.Error().Err(err).Str("subject", msg.Subject()).Msg("message without JetStream metadata; terminating it")
		_ = msg.Term()
		return
	}
	r := &run{w: w, msg: msg, meta: meta}
	req, decErr := messages.DecodeRunRequest(msg.Data())
	if decErr != nil {
		req = messages.RunRequest{ID: salvageID(msg.Data())}
	}
	if req.ID == "" {
		req.ID = DeriveRunID(meta)
	}
	r.req = req
	pool, _ := messages.PoolFromSubject(msg.Subject())
	r.state = messages.RunState{
		Version:  messages.StateVersion,
		ID:       req.ID,
		State:    messages.StateQueued,
		Profile:  req.Profile,
		Pool:     pool,
		Group:    req.GroupOrID(),
		Worker:   w.cfg.ID,
		Attempts: int(meta.NumDelivered),
		Labels:   req.Labels,
		QueuedAt: meta.Timestamp.UTC(),
	}
	r.log = w.log.With().Str("run_id", req.ID).Uint64("attempt", meta.NumDelivered).Logger()

	// Idempotency: a run that already reached a final state is never run
	// again, whichever delivery or duplicate submission this is.
	if prev, err := w.loadState(ctx, req.ID); err == nil && prev.State.Final() {
		r.log.Info().Str("state", string(prev.State)).Msg("run already final; acking without running")
		r.ack()
		return
	} else if err != nil && !isNotFound(err) {
		r.retry(ctx, fmt.Errorf("read run state: %w", err))
		return
	}

	if decErr != nil {
		r.fail(ctx, decErr.Error(), nil)
		return
	}
	if req.Pool != pool {
		r.fail(ctx, fmt.Sprintf("request names pool %q but was published to %s", req.Pool, msg.Subject()), nil)
		return
	}
	prof, ok := w.cfg.Profiles[req.Profile]
	if !ok {
		r.fail(ctx, fmt.Sprintf("unknown profile %q (this worker has: %v)", req.Profile, w.cfg.Profiles.Names()), nil)
		return
	}
	r.execute(ctx, prof)
}

// salvageID returns the id field of an invalid request when it is a valid
// token, so the failure is recorded under the id the client chose.
func salvageID(data []byte) string {
	var v struct {
		ID string `json:"id"`
	}
	if len(data) > messages.MaxRequestBytes || json.Unmarshal(data, &v) != nil {
		return ""
	}
	if messages.ValidateToken("id", v.ID) != nil {
		return ""
	}
	return v.ID
}

func (w *Worker) loadState(ctx context.Context, id string) (messages.RunState, error) {
	var st messages.RunState
	e, err := w.runs.Get(ctx, id)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		return st, fmt.Errorf("decode state of %s: %w", id, err)
	}
	return st, nil
}

// execute starts the container and follows it to its end.
func (r *run) execute(ctx context.Context, prof Profile) {
	w := r.w
	attempt := int(r.meta.NumDelivered)

	if attempt > 1 {
		// An earlier delivery's container belongs to a worker that lost the
		// run (it died or missed AckWait): remove it before starting ours so
		// two containers of one run never overlap.
		if err := w.removeRunContainers(ctx, r.req.ID); err != nil {
			r.retry(ctx, fmt.Errorf("remove earlier containers: %w", err))
			return
		}
	}

	spec, err := BuildSpec(SpecInput{
		Profile: prof, Request: r.req, Attempt: attempt, WorkerID: w.cfg.ID, Install: w.install,
		Now: time.Now(), LookupEnv: w.cfg.LookupEnv,
	})
	if err != nil {
		r.fail(ctx, err.Error(), nil)
		return
	}
	timeout := time.Duration(r.req.Timeout)
	if timeout == 0 {
		timeout = prof.timeout
	}
	if timeout == 0 {
		timeout = w.cfg.DefaultTimeout
	}

	// Keep the delivery alive for as long as we hold it, from before the
	// container starts until the outcome is recorded.
	stopProgress := r.keepInProgress()
	defer stopProgress()

	out := newOutputPublisher(w.js, r.req.ID, attempt)
	c, err := w.cfg.Runtime.Start(ctx, spec, out.write)
	if err != nil {
		_, _ = out.close(ctx)
		if errors.Is(err, ErrPermanent) {
			r.fail(ctx, err.Error(), nil)
		} else {
			r.retry(ctx, fmt.Errorf("start container: %w", err))
		}
		return
	}
	w.track(r.req.ID, c.ID())
	defer w.untrack(r.req.ID)

	r.state.State = messages.StateRunning
	r.state.ContainerID = c.ID()
	r.state.StartedAt = time.Now().UTC()
	if err := r.putState(ctx); err != nil {
		r.log.Warn().Err(err).Msg("record running state")
	}
	r.event(ctx, messages.Event{Type: messages.EventStarted, ContainerID: c.ID()})
	out.release()
	r.log.Info().Str("container_id", shortID(c.ID())).Str("profile", prof.Name).Msg("run started")

	waitCtx, cancelWait := context.WithTimeout(ctx, timeout)
	status, err := c.Wait(waitCtx)
	cancelWait()
	final, reason := messages.StateSucceeded, ""
	switch {
	case err != nil && ctx.Err() != nil:
		// The worker is shutting down hard: stop the container and hand the
		// request back for another worker.
		r.abandon(c, out)
		return
	case err != nil && errors.Is(err, context.DeadlineExceeded):
		final, reason = messages.StateTimedOut, fmt.Sprintf("timed out after %s", timeout)
		status, err = r.stopAndWait(c)
		if err != nil {
			r.log.Warn().Err(err).Msg("stop timed-out container")
		}
	case err != nil:
		_, _ = out.close(ctx)
		r.removeContainer(c)
		r.retry(ctx, fmt.Errorf("wait for container: %w", err))
		return
	}
	r.state.ExitCode = &status.Code
	if final == messages.StateSucceeded {
		switch {
		case status.OOMKilled:
			final, reason = messages.StateFailed, "oom"
		case status.Code != 0:
			final, reason = messages.StateFailed, exitReason(status, out.lastErrLine(), spec)
		}
	}
	n, perr := out.close(ctx)
	r.state.OutputBytes = n
	if perr != nil {
		r.log.Warn().Err(perr).Msg("some output events were not acknowledged")
	}
	r.finish(ctx, final, reason)
	r.removeContainer(c)
}

// exitReason explains a non-zero exit: the code, a diagnosis when stderr
// shows a jail limit was hit, and the last line of stderr.
func exitReason(status ExitStatus, lastErr string, spec ContainerSpec) string {
	reason := fmt.Sprintf("exit code %d", status.Code)
	switch {
	case strings.Contains(lastErr, "No space left on device"):
		reason += fmt.Sprintf(" (no space left on device: a tmpfs is full; /tmp is %s)", spec.Tmpfs["/tmp"])
	case strings.Contains(lastErr, "can't fork"), strings.Contains(lastErr, "Resource temporarily unavailable"),
		strings.Contains(lastErr, "fork: retry"):
		reason += fmt.Sprintf(" (pids limit of %d reached: process creation failed)", spec.PidsLimit)
	}
	if status.Error != "" {
		reason += ": " + status.Error
	}
	if lastErr != "" {
		reason += ": " + lastErr
	}
	return reason
}

// stopAndWait stops c with the worker's grace period and waits for its exit.
func (r *run) stopAndWait(c Container) (ExitStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), r.w.cfg.StopGrace+30*time.Second)
	defer cancel()
	if err := c.Stop(ctx, r.w.cfg.StopGrace); err != nil {
		return ExitStatus{Code: -1}, err
	}
	return c.Wait(ctx)
}

// abandon stops and removes c and hands the request back, for a worker that
// is shutting down.
func (r *run) abandon(c Container, out *outputPublisher) {
	ctx, cancel := context.WithTimeout(context.Background(), r.w.cfg.StopGrace+30*time.Second)
	defer cancel()
	_, _ = r.stopAndWait(c)
	_, _ = out.close(ctx)
	r.removeContainer(c)
	r.state.State = messages.StateQueued
	r.state.Reason = "handed back: worker " + r.w.cfg.ID + " shut down"
	r.state.ContainerID = ""
	r.state.ExitCode = nil
	if err := r.putState(ctx); err != nil {
		r.log.Warn().Err(err).Msg("record handed-back state")
	}
	if err := r.msg.Nak(); err != nil {
		r.log.Warn().Err(err).Msg("nak on shutdown")
	}
	r.log.Info().Msg("run handed back on shutdown")
}

func (r *run) removeContainer(c Container) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Remove(ctx); err != nil {
		r.log.Warn().Err(err).Str("container_id", shortID(c.ID())).Msg("remove container; the reconciler will retry")
	}
}

// keepInProgress sends InProgress every InProgressInterval until the
// returned function is called, so a run longer than AckWait is not
// redelivered.
func (r *run) keepInProgress() func() {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(r.w.cfg.InProgressInterval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if err := r.msg.InProgress(); err != nil {
					r.log.Warn().Err(err).Msg("in-progress")
				}
			}
		}
	}()
	return func() { close(stop); <-done }
}

// finish records a final state and the finished event, then removes the
// request from the stream: ack for success, a dead letter then term for the
// rest. The dead letter is published, and its publish acknowledged, before
// the term, so a crash in between leaves the request to be redelivered and
// the dead letter deduplicated by its Nats-Msg-Id.
func (r *run) finish(ctx context.Context, final messages.State, reason string) {
	r.state.State = final
	r.state.Reason = reason
	r.state.FinishedAt = time.Now().UTC()
	// Recording the outcome must survive a worker shutdown that cancels ctx.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := r.putState(ctx); err != nil {
		r.retry(ctx, fmt.Errorf("record final state: %w", err))
		return
	}
	r.event(ctx, messages.Event{
		Type: messages.EventFinished, State: final, ExitCode: r.state.ExitCode,
		Reason: reason, ContainerID: r.state.ContainerID,
	})
	lg := r.log.Info()
	if final != messages.StateSucceeded {
		lg = r.log.Warn()
	}
	lg.Str("state", string(final)).Str("reason", reason).Msg("run finished")
	if final == messages.StateSucceeded {
		r.ack()
		return
	}
	if err := r.deadLetter(ctx); err != nil {
		r.log.Error().Err(err).Msg("publish dead letter; leaving the request for redelivery")
		_ = r.msg.NakWithDelay(5 * time.Second)
		return
	}
	if err := r.msg.Term(); err != nil {
		r.log.Warn().Err(err).Msg("term")
	}
}

// fail ends the run failed before or without a container, for a reason
// retrying cannot fix.
func (r *run) fail(ctx context.Context, reason string, exitCode *int) {
	r.state.ExitCode = exitCode
	r.finish(ctx, messages.StateFailed, reason)
}

// retry hands the request back with an exponential, jittered delay for an
// infrastructure failure, or fails the run when this was the last delivery.
func (r *run) retry(ctx context.Context, cause error) {
	attempt := int(r.meta.NumDelivered)
	if attempt >= r.w.cfg.Provision.MaxDeliver {
		r.fail(ctx, fmt.Sprintf("gave up after %d attempts: %v", attempt, cause), nil)
		return
	}
	delay := retryDelay(attempt)
	r.log.Warn().Err(cause).Dur("delay", delay).Msg("infrastructure failure; retrying")
	r.state.State = messages.StateQueued
	r.state.Reason = "retrying: " + cause.Error()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := r.putState(sctx); err != nil {
		r.log.Warn().Err(err).Msg("record retry state")
	}
	// NakWithDelay, not Nak: the consumer's BackOff applies only to ack
	// timeouts, never to a plain Nak.
	if err := r.msg.NakWithDelay(delay); err != nil {
		r.log.Warn().Err(err).Msg("nak")
	}
}

// retryDelay returns the delay before delivery attempt+1: exponential from
// 1s, doubling, with ±50% jitter, capped at 1 minute.
func retryDelay(attempt int) time.Duration {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = time.Second
	b.MaxInterval = time.Minute
	b.Multiplier = 2
	b.RandomizationFactor = 0.5
	b.MaxElapsedTime = 0
	d := b.NextBackOff()
	for i := 1; i < attempt; i++ {
		d = b.NextBackOff()
	}
	return d
}

func (r *run) ack() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// DoubleAck waits for the server to confirm, so a lost ack shows up here
	// instead of as a surprise redelivery.
	if err := r.msg.DoubleAck(ctx); err != nil {
		r.log.Warn().Err(err).Msg("ack")
	}
}

func (r *run) putState(ctx context.Context) error {
	r.state.UpdatedAt = time.Now().UTC()
	b, err := json.Marshal(r.state)
	if err != nil {
		return err
	}
	_, err = r.w.runs.Put(ctx, r.state.ID, b)
	return err
}

// event publishes a JSON event for the run and waits for its ack.
func (r *run) event(ctx context.Context, ev messages.Event) {
	ev.RunID = r.req.ID
	ev.Time = time.Now().UTC()
	ev.Attempt = int(r.meta.NumDelivered)
	ev.Worker = r.w.cfg.ID
	b, err := json.Marshal(ev)
	if err != nil {
		return
	}
	m := nats.NewMsg(messages.SubjectEvents(r.req.ID, ev.Type))
	m.Data = b
	m.Header.Set(messages.HeaderRunID, r.req.ID)
	m.Header.Set(messages.HeaderAttempt, strconv.Itoa(ev.Attempt))
	if _, err := r.w.js.PublishMsg(ctx, m); err != nil {
		r.log.Warn().Err(err).Str("type", string(ev.Type)).Msg("publish event")
	}
}

// deadLetter copies the original request, byte for byte, to
// jetcrew.failed.<pool>.<run_id> with headers saying why, and waits for the
// server's ack.
func (r *run) deadLetter(ctx context.Context) error {
	pool := r.state.Pool
	if pool == "" {
		pool = messages.DefaultPool
	}
	m := nats.NewMsg(messages.SubjectFailed(pool, r.req.ID))
	m.Data = r.msg.Data()
	m.Header.Set(messages.HeaderRunID, r.req.ID)
	m.Header.Set(messages.HeaderError, oneLine(r.state.Reason))
	m.Header.Set(messages.HeaderState, string(r.state.State))
	m.Header.Set(messages.HeaderAttempts, strconv.Itoa(r.state.Attempts))
	m.Header.Set(messages.HeaderWorker, r.w.cfg.ID)
	if r.state.ExitCode != nil {
		m.Header.Set(messages.HeaderExitCode, strconv.Itoa(*r.state.ExitCode))
	}
	// One dead letter per run and delivery, even when a crash makes us
	// publish it twice within the duplicate window.
	m.Header.Set(jetstream.MsgIDHeader, "dl-"+r.req.ID+"-"+strconv.FormatUint(r.meta.Sequence.Stream, 10))
	_, err := r.w.js.PublishMsg(ctx, m)
	return err
}

func oneLine(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '\r' || c == '\n' {
			b[i] = ' '
		}
	}
	if len(b) > 1024 {
		b = b[:1024]
	}
	return string(b)
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func (w *Worker) track(runID, containerID string) {
	w.mu.Lock()
	w.active[runID] = &activeRun{containerID: containerID}
	w.mu.Unlock()
}

func (w *Worker) untrack(runID string) {
	w.mu.Lock()
	delete(w.active, runID)
	w.mu.Unlock()
}
