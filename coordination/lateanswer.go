package coordination

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// Late answers: an ask whose call returned before its question's wait
// ended (relay.AskRequest.ReturnAfterSeconds: the bridge's answer to an MCP
// client that sent no progress token and would give up on its own) leaves
// the question open. The session keeps watching for its answer for the rest
// of the wait, and puts an answer that comes in the run's inbox, as a
// message from whoever answered carrying messages.HeaderAnswerTo.
//
// A run's questions outlive a worker that leaves the run running (Leave:
// it stops for an upgrade) or dies with it: an ask waiting then fails as
// interrupted and leaves its question open, and the worker adopting the
// run takes over every question of the run's presence session still open
// (resume), as late answers.

// lateWaits are the session's waits for late answers. Each ends when its
// question's wait does or the session's context ends; Detach stops new ones
// and waits for those running.
type lateWaits struct {
	mu      sync.Mutex
	stopped bool
	wg      sync.WaitGroup
}

// start runs wait in a goroutine of its own, unless the session is
// stopping; it reports whether it did.
func (l *lateWaits) start(wait func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return false
	}
	l.wg.Go(wait)
	return true
}

// stop refuses new waits and waits for the running ones (their session's
// context has ended).
func (l *lateWaits) stop() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	l.wg.Wait()
}

// awaitLate takes over q's wait (its watcher w, its place among the run's
// open questions) for rest more, after the call that asked it returned:
// an answer goes to the run's inbox (deliverLate), and whatever ends the
// wait drops the question. It reports false, doing nothing, when the
// session is stopping.
func (qs *questions) awaitLate(kv jetstream.KeyValue, w jetstream.KeyWatcher, q messages.CoordQuestion, rest time.Duration) bool {
	return qs.late.start(func() {
		defer qs.forget(q.ID)
		ans, from, why, _ := qs.waitAnswer(qs.c.ctx, w, rest)
		_ = w.Stop()
		if why == whyLeft {
			return // kept for the adopter's session
		}
		qs.drop(qs.c.ctx, kv, messages.CoordQuestionKey(q.GroupRef(), q.RunID, q.ID))
		if why != "" {
			qs.c.emit(Event{Kind: EventUnanswered, QuestionID: q.ID, To: q.To, Reason: why})
			return
		}
		seq, err := qs.deliverLate(q, ans, from)
		if err != nil {
			qs.c.log.Warn().Err(err).Str("question_id", q.ID).Msg("put a late answer in the run's inbox")
			qs.c.emit(Event{Kind: EventUnanswered, QuestionID: q.ID, To: q.To, Reason: "the answer came after the call returned and could not be put in the inbox: " + err.Error()})
			return
		}
		qs.c.emit(Event{Kind: EventAnswered, QuestionID: q.ID, From: from, Bytes: len(ans), MessageID: seq})
	})
}

// deliverLate puts the answer to q, given by from (a run of the group or
// RecipientOperator), in the asking run's inbox: a message on
// jetcrew.coord.<pool>.<group>.<run_id> with Jetcrew-From from and
// messages.HeaderAnswerTo q.ID, published once per question
// (Nats-Msg-Id "answer:<question_id>"). It returns the message's stream
// sequence. The worker publishes where runs' messages travel, as it does
// the question itself; the answer is from's own (a peer's reply stamped by
// its worker, or an operator's answer key).
func (qs *questions) deliverLate(q messages.CoordQuestion, ans, from string) (string, error) {
	ctx, cancel := qs.c.opContext(context.WithoutCancel(qs.c.ctx))
	defer cancel()
	msg := nats.NewMsg(Subject(q.GroupRef(), q.RunID))
	msg.Data = []byte(ans)
	msg.Header.Set(HeaderFrom, from)
	msg.Header.Set(messages.HeaderAnswerTo, q.ID)
	ack, err := qs.c.h.js.PublishMsg(ctx, msg, jetstream.WithMsgID("answer:"+q.ID))
	if err != nil {
		return "", err
	}
	return strconv.FormatUint(ack.Sequence, 10), nil
}

// resume takes over the run's questions an earlier session of the same
// presence session left open (a worker adopting the run, RunInfo.Adopted):
// each waits here for the rest of its wait as a late answer (awaitLate),
// so an answer given before or after the adoption reaches the run's inbox.
// Questions of another session (an earlier attempt's) are left to Close's
// expire. It returns the first error met; the questions it did not take
// over lapse with their keys' TTL.
func (qs *questions) resume(ctx context.Context) error {
	octx, cancel := qs.c.opContext(ctx)
	defer cancel()
	kv, err := qs.bucket(octx)
	if err != nil {
		return err
	}
	run := qs.c.run
	keys, err := listKeys(octx, kv, messages.CoordQuestionKey(run.GroupRef(), run.RunID, "*"))
	if err != nil {
		return fmt.Errorf("list the run's open questions: %w", err)
	}
	sess := qs.c.sessionID()
	for _, k := range keys {
		e, err := kv.Get(octx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // answered or dropped meanwhile
		}
		if err != nil {
			return fmt.Errorf("read question %s: %w", k, err)
		}
		var q messages.CoordQuestion
		if json.Unmarshal(e.Value(), &q) != nil || q.RunID != run.RunID || q.Session != sess {
			continue
		}
		w, err := kv.WatchFiltered(qs.c.ctx, []string{messages.CoordAnswerKey(q.ID), messages.CoordReplyKey(q.ID)})
		if err != nil {
			return fmt.Errorf("watch for answers to %s: %w", q.ID, err)
		}
		qs.mu.Lock()
		if qs.open == nil {
			qs.open = map[string]bool{}
		}
		qs.open[q.ID], qs.asked = true, true
		qs.mu.Unlock()
		if !qs.awaitLate(kv, w, q, time.Until(q.Until)) {
			_ = w.Stop()
			qs.forget(q.ID)
		}
	}
	return nil
}
