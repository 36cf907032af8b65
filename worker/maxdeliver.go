package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/runstate"
)

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

// onMaxDeliver moves the request named by a MaxDeliver advisory from
// JETCREW_RUNS to JETCREW_FAILED: it records the run failed (unless its state
// is already final), publishes the dead letter (deduplicated by its message
// id), and only then deletes the request from the work queue. Every step is
// idempotent, so a crash at any point is repaired by the advisory's
// redelivery.
func (w *Worker) onMaxDeliver(ctx context.Context, data []byte) error {
	var adv maxDeliverAdvisory
	if err := json.Unmarshal(data, &adv); err != nil {
		w.log.Error().Err(err).Msg("unreadable MaxDeliver advisory; dropping it")
		return nil
	}
	if adv.Stream != messages.StreamRuns {
		return nil
	}
	stream, err := w.js.Stream(ctx, messages.StreamRuns)
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
	meta := &jetstream.MsgMetadata{Timestamp: raw.Time, NumDelivered: adv.Deliveries}
	meta.Sequence.Stream = raw.Sequence
	id := messages.SalvageRunID(raw.Data)
	if req, err := messages.DecodeRunRequest(raw.Data); err == nil && req.ID != "" {
		id = req.ID
	}
	if id == "" {
		id = runstate.DeriveRunID(meta)
	}
	reason := fmt.Sprintf("delivered %d times without an outcome (MaxDeliver): the worker holding the last delivery died or lost contact", adv.Deliveries)

	prev, rev, err := w.store.Load(ctx, id)
	if err != nil && !runstate.IsNotFound(err) {
		return err
	}
	st, from := prev, prev.State
	if err != nil || (!prev.State.Final() && (prev.StreamSeq == 0 || prev.StreamSeq == raw.Sequence)) {
		if err != nil {
			st = messages.RunState{Version: messages.StateVersion, ID: id, Pool: pool, QueuedAt: raw.Time.UTC()}
		}
		st.State, st.Reason, st.StreamSeq = messages.StateFailed, reason, raw.Sequence
		st.RequestDigest = messages.RequestDigest(raw.Data) // the state is this message's now
		st.Attempts = int(adv.Deliveries)
		st.ContainerID, st.ExitCode = "", nil
		st.FinishedAt = time.Now().UTC()
		ok, err := w.store.Finalize(ctx, from, st, rev)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("run state changed meanwhile")
		}
		w.log.Warn().Str("run_id", id).Uint64("stream_seq", raw.Sequence).Msg(reason)
	}
	if st.StreamSeq == raw.Sequence && st.State.Final() {
		// No delivery is left to clean up after the last one, whose worker
		// died: its container may still run. Remove the run's containers
		// now, not when the reconciler finds them orphaned.
		if err := w.runs.RemoveRunContainers(ctx, id, st.ContainerID); err != nil {
			w.log.Warn().Err(err).Str("run_id", id).Msg("remove the exhausted run's containers; the reconciler will retry")
		}
	}
	if st.StreamSeq == raw.Sequence && st.State.Unsuccessful() {
		if st.Pool == "" {
			st.Pool = pool
		}
		dl := runstate.DeadLetterMsg(raw.Data, st, raw.Sequence, w.cfg.ID)
		runstate.CopySignature(dl.Header, raw.Header)
		if _, err := w.js.PublishMsg(ctx, dl); err != nil {
			return fmt.Errorf("publish dead letter: %w", err)
		}
	}
	if err := stream.DeleteMsg(ctx, raw.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("remove request %d: %w", raw.Sequence, err)
	}
	return nil
}
