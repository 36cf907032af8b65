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

// EgressWaiting is a bounded view of the connections waiting for an
// operator's answer (profile key egress_ask), what EgressWaiting returns.
type EgressWaiting struct {
	// Asks are the oldest waiting questions (by the time they were put),
	// at most the limit asked for, oldest first.
	Asks []messages.EgressAsk
	// Total counts every waiting question, those not in Asks included.
	Total int
}

// EgressWaiting returns the questions waiting for an operator: those of
// run runID, or of every run when runID is "". It reads the key names of
// the asks bucket (no values), drops the questions already answered
// (their worker deletes them within a moment) and reads the values of the
// limit oldest only, so a flood of questions costs a page a list of names,
// not a read each. limit 0 only counts them. It returns the bucket's
// error; none is waiting when no worker has made the bucket yet.
// EgressPending is the unbounded read the CLI lists.
func (ea *EgressAsks) EgressWaiting(ctx context.Context, runID string, limit int) (EgressWaiting, error) {
	askFilter, answerFilter := messages.EgressAskKey(">"), messages.EgressAnswerKey(">")
	if runID != "" {
		if err := messages.ValidateToken("run id", runID); err != nil {
			return EgressWaiting{}, err
		}
		askFilter, answerFilter = messages.EgressAskKey(runID+".>"), messages.EgressAnswerKey(runID+".>")
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	kv, err := ea.js.KeyValue(ctx, messages.BucketEgressAsks)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return EgressWaiting{}, nil
	}
	if err != nil {
		return EgressWaiting{}, err
	}
	w, err := kv.WatchFiltered(ctx, []string{askFilter, answerFilter}, jetstream.MetaOnly(), jetstream.IgnoreDeletes())
	if err != nil {
		return EgressWaiting{}, err
	}
	defer func() { _ = w.Stop() }()
	put := map[string]time.Time{} // question id -> when its ask was put
	answered := map[string]bool{}
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return EgressWaiting{}, fmt.Errorf("egress questions: %w", ctx.Err())
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return EgressWaiting{}, errors.New("egress questions: the watch ended early")
			case e == nil:
				done = true // every stored key was delivered
			case strings.HasPrefix(e.Key(), messages.EgressAskKey("")):
				put[strings.TrimPrefix(e.Key(), messages.EgressAskKey(""))] = e.Created()
			default:
				answered[strings.TrimPrefix(e.Key(), messages.EgressAnswerKey(""))] = true
			}
		}
	}
	ids := make([]string, 0, len(put))
	for id := range put {
		if !answered[id] {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool {
		if !put[ids[i]].Equal(put[ids[j]]) {
			return put[ids[i]].Before(put[ids[j]])
		}
		return ids[i] < ids[j]
	})
	out := EgressWaiting{Total: len(ids)}
	for _, id := range ids[:min(max(limit, 0), len(ids))] {
		e, err := kv.Get(ctx, messages.EgressAskKey(id))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			out.Total-- // answered or given up meanwhile
			continue
		}
		if err != nil {
			return EgressWaiting{}, err
		}
		var q messages.EgressAsk
		if json.Unmarshal(e.Value(), &q) == nil {
			out.Asks = append(out.Asks, q)
		}
	}
	return out, nil
}
