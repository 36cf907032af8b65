package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/runstate"
)

// errAwaitAdoption says an exhausted request's run may yet be adopted by a
// successor of its dead worker: its advisory is looked at again later.
var errAwaitAdoption = errors.New("the run may yet be adopted by a successor of its worker")

// maxDeliverAdvisory is the part of the server's
// io.nats.jetstream.advisory.v1.max_deliver advisory we read.
type maxDeliverAdvisory struct {
	Type       string `json:"type"`
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

func provisionAdvisories(ctx context.Context, js jetstream.JetStream, cfg ProvisionConfig) (jetstream.Consumer, error) {
	if err := retryProvision(ctx, func(ctx context.Context) error {
		_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name:        messages.StreamAdvisories,
			Description: "MaxDeliver advisories of jetcrew's run consumers, so no exhausted request is lost",
			Subjects:    []string{"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + messages.StreamRuns + ".>"},
			Retention:   jetstream.WorkQueuePolicy,
			Storage:     jetstream.FileStorage,
			Replicas:    cfg.Replicas,
			MaxAge:      cfg.FailedMaxAge,
		})
		return err
	}); err != nil {
		return nil, fmt.Errorf("provision stream %s: %w", messages.StreamAdvisories, err)
	}
	var c jetstream.Consumer
	err := retryProvision(ctx, func(ctx context.Context) error {
		var err error
		c, err = js.CreateOrUpdateConsumer(ctx, messages.StreamAdvisories, jetstream.ConsumerConfig{
			Durable:    messages.ConsumerAdvisories,
			AckPolicy:  jetstream.AckExplicitPolicy,
			AckWait:    30 * time.Second,
			MaxDeliver: -1,
			Replicas:   cfg.Replicas,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("provision consumer %s: %w", messages.ConsumerAdvisories, err)
	}
	return c, nil
}

// deadLetterer moves each request named by a MaxDeliver advisory to the
// dead-letter stream (onMaxDeliver), pulling the advisories from Start to
// Stop.
type deadLetterer struct {
	js       jetstream.JetStream
	store    *runstate.Store
	workerID string
	// removeContainers removes a run's containers
	// (runner.Runner.RemoveRunContainers).
	removeContainers func(ctx context.Context, runID, recorded string) error
	// liveRun, when set, says whether the running run recorded as st
	// lives on in its container: held by a live worker (answered, nil), or
	// possibly about to be adopted (errAwaitAdoption): its exhausted
	// request is then left to its holder, which removes it when the run
	// ends (runner's adopted runs), instead of failing the run.
	liveRun func(ctx context.Context, st messages.RunState, request []byte) error
	wait    time.Duration // one pull request's wait
	retry   time.Duration // delay before an advisory that failed comes back
	log     zerolog.Logger
	loop
}

// Start looks up the advisories' consumer, then pulls advisories until
// Stop.
func (d *deadLetterer) Start(ctx context.Context) error {
	cons, err := d.js.Consumer(ctx, messages.StreamAdvisories, messages.ConsumerAdvisories)
	if err != nil {
		return fmt.Errorf("worker: consumer %s: %w", messages.ConsumerAdvisories, err)
	}
	d.loop.start(ctx, func(ctx context.Context) { d.run(ctx, cons) })
	return nil
}

// Stop ends the pulls and waits for the advisory under way. It returns
// nil.
func (d *deadLetterer) Stop(context.Context) error {
	d.loop.stop()
	return nil
}

// run pulls advisories from cons until ctx ends.
func (d *deadLetterer) run(ctx context.Context, cons jetstream.Consumer) {
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, d.wait)
		batch, err := cons.Fetch(1, jetstream.FetchContext(pctx))
		if err != nil {
			cancel()
			sleepCtx(ctx, time.Second)
			continue
		}
		for m := range batch.Messages() {
			if err := d.onMaxDeliver(ctx, m.Data()); err != nil {
				d.log.Warn().Err(err).Msg("move exhausted request to the dead-letter stream; retrying")
				_ = m.NakWithDelay(d.retry)
				continue
			}
			_ = m.Ack()
		}
		cancel()
	}
}

// exhaustedRunID is the run id of the exhausted request raw, delivered
// deliveries times: its body's, salvaged when it does not decode, else
// derived from the message as a worker derives it.
func exhaustedRunID(raw *jetstream.RawStreamMsg, deliveries uint64) string {
	if req, err := messages.DecodeRunRequest(raw.Data); err == nil && req.ID != "" {
		return req.ID
	}
	if id := messages.SalvageRunID(raw.Data); id != "" {
		return id
	}
	meta := &jetstream.MsgMetadata{Timestamp: raw.Time, NumDelivered: deliveries}
	meta.Sequence.Stream = raw.Sequence
	return runstate.DeriveRunID(meta)
}

// leftToHolder reports whether the exhausted request raw, of the run
// recorded as st, is left to a live worker that holds the run (liveRun:
// it removes the request when the run ends); errAwaitAdoption while a
// successor may yet adopt the run (the advisory comes back later).
func (d *deadLetterer) leftToHolder(ctx context.Context, st messages.RunState, raw *jetstream.RawStreamMsg) (bool, error) {
	if d.liveRun == nil || st.State != messages.StateRunning || st.StreamSeq != raw.Sequence {
		return false, nil
	}
	switch err := d.liveRun(ctx, st, raw.Data); {
	case err == nil:
		d.log.Info().Str("run_id", st.ID).Str("holder", st.Worker).
			Msg("exhausted request's run lives on, held by a live worker: left to it (it removes the request when the run ends)")
		return true, nil
	case errors.Is(err, errAwaitAdoption):
		return false, err
	}
	return false, nil
}

// onMaxDeliver moves the request named by a MaxDeliver advisory from
// JETCREW_RUNS to JETCREW_FAILED: it records the run failed (unless its state
// is already final), publishes the dead letter (deduplicated by its message
// id), and only then deletes the request from the work queue. Every step is
// idempotent, so a crash at any point is repaired by the advisory's
// redelivery.
func (d *deadLetterer) onMaxDeliver(ctx context.Context, data []byte) error {
	var adv maxDeliverAdvisory
	if err := json.Unmarshal(data, &adv); err != nil {
		d.log.Error().Err(err).Msg("unreadable MaxDeliver advisory; dropping it")
		return nil
	}
	if adv.Stream != messages.StreamRuns {
		return nil
	}
	stream, err := d.js.Stream(ctx, messages.StreamRuns)
	if err != nil {
		return err
	}
	raw, err := stream.GetMsg(ctx, adv.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // already removed: nothing left to do
	}
	if err != nil {
		return fmt.Errorf("get request %d: %w", adv.StreamSeq, err)
	}
	pool, _ := messages.PoolFromSubject(raw.Subject)
	id := exhaustedRunID(raw, adv.Deliveries)
	reason := fmt.Sprintf("delivered %d times without an outcome (MaxDeliver): the worker holding the last delivery died or lost contact", adv.Deliveries)

	prev, rev, err := d.store.Load(ctx, id)
	if err != nil && !runstate.IsNotFound(err) {
		return err
	}
	st, from := prev, prev.State
	if err == nil {
		if left, lerr := d.leftToHolder(ctx, prev, raw); left || lerr != nil {
			return lerr
		}
	}
	if err != nil || (!prev.State.Final() && (prev.StreamSeq == 0 || prev.StreamSeq == raw.Sequence)) {
		if err != nil {
			st = messages.RunState{Version: messages.StateVersion, ID: id, Pool: pool, QueuedAt: raw.Time.UTC()}
		}
		st.State, st.Reason, st.StreamSeq = messages.StateFailed, reason, raw.Sequence
		st.RequestDigest = messages.RequestDigest(raw.Data) // the state is this message's now
		st.Attempts = int(adv.Deliveries)
		st.ContainerID, st.ExitCode = "", nil
		st.FinishedAt = time.Now().UTC()
		ok, err := d.store.Finalize(ctx, from, st, rev)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("run state changed meanwhile")
		}
		d.log.Warn().Str("run_id", id).Uint64("stream_seq", raw.Sequence).Msg(reason)
	}
	if st.StreamSeq == raw.Sequence && st.State.Final() {
		// No delivery is left to clean up after the last one, whose worker
		// died: its container may still run. Remove the run's containers
		// now, not when the reconciler finds them orphaned.
		if err := d.removeContainers(ctx, id, st.ContainerID); err != nil {
			d.log.Warn().Err(err).Str("run_id", id).Msg("remove the exhausted run's containers; the reconciler will retry")
		}
	}
	if st.StreamSeq == raw.Sequence && st.State.Unsuccessful() {
		if st.Pool == "" {
			st.Pool = pool
		}
		dl := runstate.DeadLetterMsg(raw.Data, st, raw.Sequence, d.workerID)
		runstate.CopySignature(dl.Header, raw.Header)
		if _, err := d.js.PublishMsg(ctx, dl); err != nil {
			return fmt.Errorf("publish dead letter: %w", err)
		}
	}
	if err := stream.DeleteMsg(ctx, raw.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("remove request %d: %w", raw.Sequence, err)
	}
	return nil
}
