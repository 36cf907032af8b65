package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// MaxRequestScan is the most messages of JETCREW_RUNS RunKnown reads looking
// for a run's request. A longer queue is not read to its end: a run whose
// request lies beyond counts as known (its state comes once a worker takes
// it).
const MaxRequestScan = 2000

// PoolWorkers returns how many live workers announce pool in the
// jetcrew-workers bucket (messages.WorkerPresence), and how many live
// workers do not say which pool they serve (written by an older version);
// those may serve it. The error wraps ErrNotProvisioned when the bucket does
// not exist.
func (d *Dispatcher) PoolWorkers(ctx context.Context, pool string) (serving, unsure int, err error) {
	kv, err := d.js.KeyValue(ctx, messages.BucketWorkers)
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
func (d *Dispatcher) QueueDepth(ctx context.Context, pool string) (uint64, error) {
	stream, err := d.js.Stream(ctx, messages.StreamRuns)
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

// RunKnown reports whether run id exists anywhere jetcrew keeps runs: a
// state in jetcrew-runs, an event in JETCREW_EVENTS, a dead letter, or a
// request in JETCREW_RUNS (found by its Nats-Msg-Id or its "id"; at most
// MaxRequestScan requests are read, and a queue longer than that counts as
// holding it). A run id known nowhere was never submitted, or everything of
// it expired: waiting for it would wait forever.
//
// The request is looked for first: a worker removes it (ack or term) only
// after it has recorded the run's state, dead letter or events, so a run
// whose request is gone by the time it is looked for is found by the
// looks after it; looked for last, a request taken and refused between
// the looks was found nowhere.
func (d *Dispatcher) RunKnown(ctx context.Context, id string) (bool, error) {
	if queued, err := d.requestQueued(ctx, id); err != nil || queued {
		return queued, err
	}
	if _, err := d.Status(ctx, id); err == nil {
		return true, nil
	} else if !errors.Is(err, ErrRunNotFound) {
		return false, err
	}
	for _, sf := range []struct{ stream, filter string }{
		{messages.StreamEvents, messages.SubjectEventsAll(id)},
		{messages.StreamFailed, messages.SubjectFailed("*", id)},
	} {
		stream, err := d.js.Stream(ctx, sf.stream)
		if err != nil {
			return false, fmt.Errorf("run %s: stream %s: %w", id, sf.stream, classify(err))
		}
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(sf.filter))
		if err != nil {
			return false, fmt.Errorf("run %s: stream %s: %w", id, sf.stream, classify(err))
		}
		if len(info.State.Subjects) > 0 {
			return true, nil
		}
	}
	return false, nil
}

// requestQueued looks for run id's request among the first MaxRequestScan
// messages of JETCREW_RUNS.
func (d *Dispatcher) requestQueued(ctx context.Context, id string) (bool, error) {
	stream, err := d.js.Stream(ctx, messages.StreamRuns)
	if err != nil {
		return false, fmt.Errorf("run %s: stream %s: %w", id, messages.StreamRuns, classify(err))
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return false, fmt.Errorf("run %s: stream %s: %w", id, messages.StreamRuns, classify(err))
	}
	if info.State.Msgs > MaxRequestScan {
		return true, nil // too long to read: assume it is there
	}
	last := info.State.LastSeq
	for seq, n := info.State.FirstSeq, 0; seq > 0 && seq <= last && n < MaxRequestScan; n++ {
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(messages.SubjectRunsPrefix+".>"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("run %s: read %s: %w", id, messages.StreamRuns, classify(err))
		}
		if m.Header.Get(jetstream.MsgIDHeader) == id || messages.SalvageRunID(m.Data) == id {
			return true, nil
		}
		seq = m.Sequence + 1
	}
	return false, nil
}
