package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/runstate"
)

// presence is this worker's key in the workers bucket
// (messages.BucketWorkers): while it exists peers take the worker for
// alive (their reconcilers' liveness lookup, alive), and clients read its
// pool and warm pools from it. The heartbeat writes it; Stop deletes it,
// so peers see the worker gone at once.
type presence struct {
	js jetstream.JetStream
	id string
	kv jetstream.KeyValue // the workers bucket, once started
}

// Start opens the workers bucket.
func (p *presence) Start(ctx context.Context) error {
	kv, err := p.js.KeyValue(ctx, messages.BucketWorkers)
	if err != nil {
		return fmt.Errorf("worker: bucket %s: %w", messages.BucketWorkers, err)
	}
	p.kv = kv
	return nil
}

// Stop deletes the worker's key, waiting at most 2 seconds (the key's
// TTL, messages.WorkerTTL, removes it otherwise). It returns nil.
func (p *presence) Stop(context.Context) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = p.kv.Delete(ctx, p.id)
	return nil
}

// put writes value under the worker's key.
func (p *presence) put(ctx context.Context, value []byte) error {
	_, err := p.kv.Put(ctx, p.id, value)
	return err
}

// alive reports whether worker id has a key in the workers bucket: the
// reconciler's liveness lookup.
func (p *presence) alive(ctx context.Context, id string) (bool, error) {
	_, err := p.kv.Get(ctx, id)
	if runstate.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// heartbeat keeps the worker's key in the workers bucket fresh: it writes
// it at Start (failing the start when it cannot), then every interval,
// after ensure (which provisions again what a restarted server lost).
type heartbeat struct {
	presence *presence
	value    func() []byte // the key's value now (Worker.presenceValue)
	ensure   func(ctx context.Context) error
	interval time.Duration
	log      zerolog.Logger
	loop
}

// Start writes the key, then beats every interval until Stop.
func (h *heartbeat) Start(ctx context.Context) error {
	if err := h.presence.put(ctx, h.value()); err != nil {
		return fmt.Errorf("worker: heartbeat: %w", err)
	}
	h.loop.start(ctx, func(ctx context.Context) {
		every(ctx, h.interval, func() {
			if err := h.ensure(ctx); err != nil && ctx.Err() == nil {
				h.log.Warn().Err(err).Msg("check provisioning")
			}
			if err := h.presence.put(ctx, h.value()); err != nil && ctx.Err() == nil {
				h.log.Warn().Err(err).Msg("heartbeat failed")
			}
		})
	})
	return nil
}

// Stop ends the beats and waits for the one under way. It returns nil.
func (h *heartbeat) Stop(context.Context) error {
	h.loop.stop()
	return nil
}

// presenceValue returns the heartbeat value this worker writes under its
// id in messages.BucketWorkers: a messages.WorkerPresence announcing its
// pool, so clients can tell that a pool has no live worker, and its warm
// pools.
func (w *Worker) presenceValue() []byte {
	b, _ := json.Marshal(messages.WorkerPresence{
		Worker: w.cfg.ID, Pool: w.cfg.Pool, Concurrency: w.cfg.Concurrency, Time: time.Now().UTC(), Warm: w.warm.Status(),
	})
	return b
}

// WarmStatus returns the worker's warm pools, one per profile that keeps
// warm containers, by profile name (nil when none does).
func (w *Worker) WarmStatus() []messages.WarmPool { return w.warm.Status() }
