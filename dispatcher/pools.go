package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// Fleet reports the pools, their queues, the live workers and the streams' nodes.
// It is the Dispatcher's role for capacity: Pools, PoolWorkers,
// QueueDepth, UnservedPools, Workers and StreamNodes.
type Fleet struct {
	js jetstream.JetStream
}

// PoolStats is what the pool's durable consumer (workers-<pool> on
// JETCREW_RUNS) says about the pool's queue.
type PoolStats struct {
	// Pool is the pool name.
	Pool string
	// Queued is the number of requests not yet delivered to any worker.
	Queued uint64
	// InFlight is the number of requests delivered and not yet acked:
	// runs a worker holds.
	InFlight int
	// MaxAckPending is the consumer's cap on InFlight across every worker
	// of the pool (0 or -1: none).
	MaxAckPending int
	// Waiting is the number of pull requests workers have open: 0 while no
	// worker is asking for runs.
	Waiting int
	// Redelivered is the number of requests delivered more than once and
	// not yet acked.
	Redelivered int
}

// Pools returns the stats of every pool that has a workers-<pool> consumer
// on JETCREW_RUNS, sorted by pool name. The error wraps ErrNotProvisioned
// when the stream does not exist.
func (f *Fleet) Pools(ctx context.Context) ([]PoolStats, error) {
	stream, err := f.js.Stream(ctx, messages.StreamRuns)
	if err != nil {
		return nil, fmt.Errorf("pools: stream %s: %w", messages.StreamRuns, classify(err))
	}
	lister := stream.ListConsumers(ctx)
	var out []PoolStats
	for ci := range lister.Info() {
		pool, ok := strings.CutPrefix(ci.Name, messages.ConsumerName(""))
		if !ok || pool == "" {
			continue
		}
		out = append(out, PoolStats{
			Pool:          pool,
			Queued:        ci.NumPending,
			InFlight:      ci.NumAckPending,
			MaxAckPending: ci.Config.MaxAckPending,
			Waiting:       ci.NumWaiting,
			Redelivered:   ci.NumRedelivered,
		})
	}
	if err := lister.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return nil, fmt.Errorf("pools: list consumers: %w", classify(err))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pool < out[j].Pool })
	return out, nil
}

// WorkerBeat is one live worker: its id, its latest heartbeat and what it
// announces in it (messages.WorkerPresence).
type WorkerBeat struct {
	// ID is the worker id (its key in the jetcrew-workers bucket).
	ID string
	// Beat is the time of the worker's latest heartbeat; zero when its
	// value cannot be read.
	Beat time.Time
	// Pool is the pool whose runs the worker takes, Concurrency its number
	// of run slots; empty and 0 for a worker of an older version, whose
	// value is its heartbeat's time alone.
	Pool        string
	Concurrency int
	// Warm are the worker's warm pools, one per profile that keeps warm
	// containers, by profile name; nil when none does.
	Warm []messages.WarmPool
}

// Presence returns b as the worker's heartbeat value (docs/wire.md,
// "Worker presence").
func (b WorkerBeat) Presence() messages.WorkerPresence {
	return messages.WorkerPresence{Worker: b.ID, Pool: b.Pool, Concurrency: b.Concurrency, Time: b.Beat, Warm: b.Warm}
}

// Workers returns the live workers (the keys of the jetcrew-workers
// bucket), sorted by id, each with what its heartbeat value
// (messages.WorkerPresence) says; a value that is a bare RFC 3339 time
// (older workers) gives the beat alone. A worker's key expires a few
// heartbeats after it stops (messages.WorkerTTL). The error wraps
// ErrNotProvisioned when the bucket does not exist.
func (f *Fleet) Workers(ctx context.Context) ([]WorkerBeat, error) {
	kv, err := f.js.KeyValue(ctx, messages.BucketWorkers)
	if err != nil {
		return nil, fmt.Errorf("workers: bucket %s: %w", messages.BucketWorkers, classify(err))
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("workers: %w", classify(err))
	}
	defer func() { _ = lister.Stop() }()
	var out []WorkerBeat
	for key := range lister.Keys() {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue // expired meanwhile
		}
		wb := WorkerBeat{ID: key}
		if err == nil {
			wb = workerBeat(key, e.Value())
		}
		out = append(out, wb)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// workerBeat reads worker id's heartbeat value: a messages.WorkerPresence,
// or the bare RFC 3339 time older workers wrote.
func workerBeat(id string, value []byte) WorkerBeat {
	wb := WorkerBeat{ID: id}
	var p messages.WorkerPresence
	if err := json.Unmarshal(value, &p); err == nil {
		wb.Beat, wb.Pool, wb.Concurrency, wb.Warm = p.Time, p.Pool, p.Concurrency, p.Warm
		return wb
	}
	wb.Beat, _ = time.Parse(time.RFC3339Nano, string(value))
	return wb
}

// PoolWorkers returns how many live workers announce pool in the
// jetcrew-workers bucket (messages.WorkerPresence), and how many live
// workers do not say which pool they serve (written by an older version);
// those may serve it. The error wraps ErrNotProvisioned when the bucket does
// not exist.
func (f *Fleet) PoolWorkers(ctx context.Context, pool string) (serving, unsure int, err error) {
	kv, err := f.js.KeyValue(ctx, messages.BucketWorkers)
	if err != nil {
		return 0, 0, fmt.Errorf("live workers: bucket %s: %w", messages.BucketWorkers, classify(err))
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("live workers: %w", classify(err))
	}
	defer func() { _ = lister.Stop() }()
	for key := range lister.Keys() {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue // gone meanwhile
		}
		if err != nil {
			return 0, 0, fmt.Errorf("live workers: %w", classify(err))
		}
		var p messages.WorkerPresence
		switch {
		case json.Unmarshal(e.Value(), &p) != nil || p.Pool == "":
			unsure++
		case p.Pool == pool:
			serving++
		}
	}
	return serving, unsure, nil
}

// QueueDepth returns how many requests of pool wait in JETCREW_RUNS (taken
// ones, still running, included until their outcome is recorded).
func (f *Fleet) QueueDepth(ctx context.Context, pool string) (uint64, error) {
	stream, err := f.js.Stream(ctx, messages.StreamRuns)
	if err != nil {
		return 0, fmt.Errorf("queue depth: %w", classify(err))
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(messages.SubjectRuns(pool)))
	if err != nil {
		return 0, fmt.Errorf("queue depth: %w", classify(err))
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n, nil
}
