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

// EgressAsks lists and answers the egress proxy's questions about unlisted hosts.
// It is the Dispatcher's role for the jetcrew-egress-asks bucket
// (EgressPending, AnswerEgress, EgressWaiting).
type EgressAsks struct {
	js jetstream.JetStream
}

// ErrNoQuestion is returned by Answer for a question that is not waiting
// (never put, answered, or given up).
var ErrNoQuestion = errors.New("no such question is waiting")

// ErrAnswered is returned by Answer when another operator answered first.
var ErrAnswered = errors.New("the question was already answered")

// EgressPending returns the connections of runs waiting for an operator's
// answer (profile key egress_ask), oldest first. It returns the bucket's
// error; none is waiting when no worker has made the bucket yet.
func (ea *EgressAsks) EgressPending(ctx context.Context) ([]messages.EgressAsk, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	kv, err := ea.js.KeyValue(ctx, messages.BucketEgressAsks)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	lister, err := kv.ListKeysFiltered(ctx, messages.EgressAskKey(">"))
	if err != nil {
		return nil, err
	}
	var out []messages.EgressAsk
	for k := range lister.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue // answered meanwhile
		}
		var q messages.EgressAsk
		if json.Unmarshal(e.Value(), &q) == nil {
			out = append(out, q)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out, nil
}

// AnswerEgress answers question id ("<run_id>.<n>", from EgressPending):
// allow or deny the run's connection, for the run, or with forProfile for
// every run of the question's profile from now on (kept in the approvals
// bucket until deleted). by names who answers; it is recorded in the run's
// egress event. It returns ErrNoQuestion when id is not waiting,
// ErrAnswered when another answer came first, or the bucket's error.
func (ea *EgressAsks) AnswerEgress(ctx context.Context, id string, allow, forProfile bool, by string) (messages.EgressAsk, error) {
	if _, ok := messages.ParseEgressAskID(id); !ok {
		return messages.EgressAsk{}, fmt.Errorf("answer: %q is not a question id (<run_id>.<n>, from jetcrew egress pending)", id)
	}
	by = strings.TrimSpace(by)
	if by == "" || len(by) > 128 {
		return messages.EgressAsk{}, errors.New("answer: say who answers (1 to 128 characters)")
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	kv, err := ea.js.KeyValue(ctx, messages.BucketEgressAsks)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return messages.EgressAsk{}, ErrNoQuestion
	}
	if err != nil {
		return messages.EgressAsk{}, err
	}
	e, err := kv.Get(ctx, messages.EgressAskKey(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return messages.EgressAsk{}, ErrNoQuestion
	}
	if err != nil {
		return messages.EgressAsk{}, err
	}
	var q messages.EgressAsk
	if err := json.Unmarshal(e.Value(), &q); err != nil {
		return messages.EgressAsk{}, fmt.Errorf("question %s: %w", id, err)
	}
	ans := messages.EgressAnswer{Allow: allow, Scope: "run", By: by, Time: time.Now().UTC()}
	if forProfile {
		ans.Scope = "profile"
		apv, err := ea.js.KeyValue(ctx, messages.BucketEgressApprovals)
		if err != nil {
			return q, err
		}
		data, _ := json.Marshal(ans)
		if _, err := apv.Put(ctx, messages.EgressApprovalKey(q.Profile, q.Host, q.Port), data); err != nil {
			return q, err
		}
	}
	data, _ := json.Marshal(ans)
	if _, err := kv.Create(ctx, messages.EgressAnswerKey(id), data); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return q, ErrAnswered
		}
		return q, err
	}
	return q, nil
}

// withDefaultTimeout gives ctx defaultRequestTimeout when it has no
// deadline.
func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, defaultRequestTimeout)
}
