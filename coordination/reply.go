package coordination

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

// Replies: a run answers a peer's question (the reply call) by creating the
// question's reply key in BucketQuestions (messages.CoordReplyKey), which
// the asker's session watches; the first reply wins.

// noQuestion is the refusal of a reply to id, a question not open in the
// run's group.
func noQuestion(id string) *apiError {
	return &apiError{status: http.StatusNotFound, code: relay.CodeNoQuestion, msg: fmt.Sprintf(
		"reply refused: no open question %s in your group (answered, timed out, its run ended, or never asked)", id)}
}

// findQuestion returns the open question id, or a CodeNoQuestion error.
func findQuestion(ctx context.Context, kv jetstream.KeyValue, id string) (messages.CoordQuestion, error) {
	var q messages.CoordQuestion
	none := noQuestion(id)
	keys, err := listKeys(ctx, kv, messages.CoordQuestionByID(id))
	if err != nil {
		return q, fmt.Errorf("find question %s: %w", id, err)
	}
	if len(keys) == 0 {
		return q, none
	}
	e, err := kv.Get(ctx, keys[0])
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return q, none
	}
	if err != nil {
		return q, fmt.Errorf("read question %s: %w", id, err)
	}
	if err := json.Unmarshal(e.Value(), &q); err != nil || q.ID != id {
		return q, none
	}
	return q, nil
}

// reply answers a peer's question as this run: the first reply wins; the
// same reply again is a duplicate, not an error.
func (qs *questions) reply(ctx context.Context, req relay.ReplyRequest) (relay.ReplyResponse, error) {
	ctx, cancel := qs.c.opContext(ctx)
	defer cancel()
	kv, err := qs.bucket(ctx)
	if err != nil {
		return relay.ReplyResponse{}, err
	}
	q, err := findQuestion(ctx, kv, req.QuestionID)
	if err == nil && q.GroupRef() != qs.c.run.GroupRef() {
		err = noQuestion(req.QuestionID) // another group's questions are not shown
	}
	if err != nil {
		return relay.ReplyResponse{}, err
	}
	if err := qs.mayReply(q); err != nil {
		return relay.ReplyResponse{}, err
	}
	resp := relay.ReplyResponse{QuestionID: q.ID, To: q.RunID}
	a := messages.CoordAnswer{Answer: req.Answer, By: qs.c.run.RunID, Time: time.Now().UTC()}
	data, err := json.Marshal(a)
	if err != nil {
		return resp, err
	}
	_, err = kv.Create(ctx, messages.CoordReplyKey(q.ID), data, jetstream.KeyTTL(messages.CoordAnswerTTL))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return qs.replyAgain(ctx, kv, resp, a)
	}
	if err != nil {
		return resp, fmt.Errorf("reply to question %s: %w", q.ID, err)
	}
	qs.c.emit(Event{Kind: EventReplied, To: q.RunID, QuestionID: q.ID, Bytes: len(req.Answer)})
	return resp, nil
}

// mayReply refuses a reply to q by this run unless q is to this run, or to
// "all" from another run.
func (qs *questions) mayReply(q messages.CoordQuestion) error {
	refuse := func(why string) error {
		return &apiError{status: http.StatusForbidden, code: relay.CodeInvalid, msg: "reply refused: question " + q.ID + " " + why}
	}
	switch {
	case q.RunID == qs.c.run.RunID:
		return refuse("is your own")
	case q.To == RecipientOperator:
		return refuse("is to the operator: only a person answers it (jetcrew answer)")
	case q.To != RecipientAll && q.To != qs.c.run.RunID:
		return refuse("is to run " + q.To + ", not to you")
	}
	return nil
}

// replyAgain handles a reply to a question that already has one: this run's
// same answer again is a duplicate; anything else is refused, naming who
// answered first.
func (qs *questions) replyAgain(ctx context.Context, kv jetstream.KeyValue, resp relay.ReplyResponse, a messages.CoordAnswer) (relay.ReplyResponse, error) {
	e, err := kv.Get(ctx, messages.CoordReplyKey(resp.QuestionID))
	if err != nil {
		return resp, fmt.Errorf("read the reply to question %s: %w", resp.QuestionID, err)
	}
	var first messages.CoordAnswer
	if json.Unmarshal(e.Value(), &first) == nil && first.By == a.By && first.Answer == a.Answer {
		resp.Duplicate = true
		return resp, nil
	}
	return resp, &apiError{status: http.StatusConflict, code: relay.CodeAnswered, msg: fmt.Sprintf(
		"reply refused: run %s answered question %s first", first.By, resp.QuestionID)}
}
