package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// Coordination answers agents' questions, steers runs and speaks to groups.
// It is the Dispatcher's role for the operator's side of coordination:
// questions (OpenQuestions, AnswerQuestion), steering a running agent
// (Steer) and messages to a group's runs (Send). It reads runs' states
// through RunStates.
type Coordination struct {
	js   jetstream.JetStream
	runs *RunStates
}

// MaxAnswerBytes is the longest answer AnswerQuestion takes, in bytes: what
// a run's reply may be (relay.MaxAnswerBytes).
const MaxAnswerBytes = 4 << 10

// ErrNotToOperator is returned by AnswerQuestion for a question a run put
// to a peer or to its group: only its peers answer it.
var ErrNotToOperator = errors.New("the question is not to the operator")

// OpenQuestions returns the runs' questions to the operator that wait for
// an answer (the ask tool with to "operator"), oldest first: the open
// questions of messages.BucketCoordQuestions whose Until has not passed and
// whose asker still waits (askerWaits). No bucket (coordination never
// provisioned) is no question.
func (c *Coordination) OpenQuestions(ctx context.Context) ([]messages.CoordQuestion, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	kv, err := c.js.KeyValue(ctx, messages.BucketCoordQuestions)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	w, err := kv.Watch(ctx, "ask.>", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("list questions: %w", err)
	}
	defer func() { _ = w.Stop() }()
	now := time.Now()
	var out []messages.CoordQuestion
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("list questions: %w", ctx.Err())
		case e := <-w.Updates():
			if e == nil { // every current key has been delivered
				slices.SortFunc(out, func(a, b messages.CoordQuestion) int {
					return a.Time.Compare(b.Time)
				})
				return c.waiting(ctx, out), nil
			}
			var q messages.CoordQuestion
			if json.Unmarshal(e.Value(), &q) != nil || q.To != messages.RecipientOperator || !q.Until.After(now) {
				continue
			}
			out = append(out, q)
		}
	}
}

// AnswerQuestion answers question id (from OpenQuestions) as the operator
// with text (1 to MaxAnswerBytes bytes of UTF-8): it writes
// messages.CoordAnswerKey(id), which the asking run's worker watches. by
// names who answers (1 to 128 bytes); the run is told "operator". It
// returns the question; ErrNoQuestion when id is not open, ErrNotToOperator
// for a question to a peer or the group, ErrAnswered when another answer
// came first, or the bucket's error.
func (c *Coordination) AnswerQuestion(ctx context.Context, id, text, by string) (messages.CoordQuestion, error) {
	var q messages.CoordQuestion
	if !messages.ValidCoordQuestionID(id) {
		return q, fmt.Errorf("answer: %q is not a question id (\"q\" and 16 letters or digits, from jetcrew questions)", id)
	}
	switch {
	case text == "":
		return q, fmt.Errorf("answer: %w", ErrEmptyMessage)
	case len(text) > MaxAnswerBytes:
		return q, fmt.Errorf("answer: %d bytes, longest allowed is %d", len(text), MaxAnswerBytes)
	case !utf8.ValidString(text):
		return q, errors.New("answer: not valid UTF-8")
	}
	if by = strings.TrimSpace(by); by == "" || len(by) > 128 {
		return q, errors.New("answer: say who answers (1 to 128 characters)")
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	kv, err := c.js.KeyValue(ctx, messages.BucketCoordQuestions)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return q, ErrNoQuestion
	}
	if err != nil {
		return q, err
	}
	if q, err = openQuestion(ctx, kv, id); err != nil {
		return q, err
	}
	if len(c.waiting(ctx, []messages.CoordQuestion{q})) == 0 {
		return q, ErrNoQuestion // its asker is gone: nobody would read the answer
	}
	if q.To != messages.RecipientOperator {
		return q, ErrNotToOperator
	}
	data, _ := json.Marshal(messages.CoordAnswer{Answer: text, By: by, Time: time.Now().UTC()})
	if _, err := kv.Create(ctx, messages.CoordAnswerKey(id), data, jetstream.KeyTTL(messages.CoordAnswerTTL)); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return q, ErrAnswered
		}
		return q, fmt.Errorf("answer %s: %w", id, err)
	}
	return q, nil
}

// openQuestion reads question id's key, or returns ErrNoQuestion.
func openQuestion(ctx context.Context, kv jetstream.KeyValue, id string) (messages.CoordQuestion, error) {
	var q messages.CoordQuestion
	l, err := kv.ListKeysFiltered(ctx, messages.CoordQuestionByID(id))
	if err != nil {
		return q, fmt.Errorf("find question %s: %w", id, err)
	}
	defer func() { _ = l.Stop() }()
	var key string
	for k := range l.Keys() {
		key = k
	}
	if err := ctx.Err(); err != nil { // the lister stops early when ctx ends
		return q, fmt.Errorf("find question %s: %w", id, err)
	}
	if key == "" {
		return q, ErrNoQuestion
	}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return q, ErrNoQuestion
	}
	if err != nil {
		return q, fmt.Errorf("read question %s: %w", id, err)
	}
	if err := json.Unmarshal(e.Value(), &q); err != nil || q.ID != id || !q.Until.After(time.Now()) {
		return q, ErrNoQuestion
	}
	return q, nil
}

// waiting keeps the questions of qs whose asker still waits: a question's
// key outlives a worker that died while its run asked (until the
// question's Until), but the run's presence in
// messages.BucketCoordPeers, which names the session that asked, ends
// within a minute. A question whose presence cannot be read is kept.
func (c *Coordination) waiting(ctx context.Context, qs []messages.CoordQuestion) []messages.CoordQuestion {
	if len(qs) == 0 {
		return qs
	}
	peers, err := c.js.KeyValue(ctx, messages.BucketCoordPeers)
	if err != nil {
		return qs
	}
	return slices.DeleteFunc(qs, func(q messages.CoordQuestion) bool {
		e, err := peers.Get(ctx, q.GroupRef().Key()+"."+q.RunID)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return true
		}
		var p struct {
			State   messages.State `json:"state"`
			Session string         `json:"session"`
		}
		if err != nil || json.Unmarshal(e.Value(), &p) != nil {
			return false
		}
		return p.State.Final() || (q.Session != "" && p.Session != q.Session)
	})
}
