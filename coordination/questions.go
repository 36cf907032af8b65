package coordination

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

// Questions that wait: a run's ask call stores its question in
// BucketQuestions (messages.CoordQuestionKey), puts it on the group's
// conversation as a message carrying the question id (a peer reads it in
// its inbox; the operator on jetcrew questions and the console), and waits
// for an answer key (an operator's, messages.CoordAnswerKey) or a reply key
// (a peer's, through its worker, messages.CoordReplyKey) to appear. Whatever
// ends the wait (an answer, the timeout, the call or the run ending), the
// question's key is purged at once: the open list holds only questions
// someone still waits on. Every key carries a TTL, so a dead worker's
// questions leave it by themselves.

// questionMarkerTTL is how long a purge marker of BucketQuestions lives
// (the bucket's LimitMarkerTTL, and PurgeTTL of every purge): long enough
// for a watcher to see the purge.
const questionMarkerTTL = time.Minute

// askDeadlineMargin is what an ask leaves of its run's remaining time: the
// agent gets the "no answer" result while its run can still act on it.
const askDeadlineMargin = 10 * time.Second

// progressEvery is how often the bridge tells the MCP client that an ask is
// still waiting (a progress notification, when the call asked for them).
const progressEvery = 15 * time.Second

// QuestionConfig configures the ask and reply calls of a Host's sessions.
// Zero fields take the documented defaults.
type QuestionConfig struct {
	// Rate is how many ask and reply calls per second one run may make,
	// on average, refused ones included. Default 0.5; negative means
	// unlimited.
	Rate float64
	// Burst is how many ask and reply calls a run may make at once before
	// Rate applies. Default 5.
	Burst int
	// MaxOpenPerRun is the most questions one run may have waiting at
	// once. Default 4.
	MaxOpenPerRun int
	// MaxOpenPerGroup is the most questions the runs of one group may have
	// waiting at once. Default 32. Two runs on different workers asking at
	// the same moment may each pass it once (the count is read, then the
	// question written).
	MaxOpenPerGroup int
}

func (c QuestionConfig) withDefaults() QuestionConfig {
	c.Rate = cmp.Or(c.Rate, 0.5)
	c.Burst = cmp.Or(c.Burst, 5)
	c.MaxOpenPerRun = cmp.Or(c.MaxOpenPerRun, 4)
	c.MaxOpenPerGroup = cmp.Or(c.MaxOpenPerGroup, 32)
	return c
}

func (c QuestionConfig) validate() error {
	if c.Burst < 1 {
		return fmt.Errorf("coordination: ask burst %d must be at least 1", c.Burst)
	}
	if c.Rate != c.Rate {
		return errors.New("coordination: ask rate is NaN")
	}
	if c.MaxOpenPerRun < 1 || c.MaxOpenPerGroup < c.MaxOpenPerRun {
		return fmt.Errorf("coordination: open questions per run %d and per group %d must be at least 1 and at most the group's", c.MaxOpenPerRun, c.MaxOpenPerGroup)
	}
	return nil
}

// questions is a session's questions that wait: the ask and reply calls,
// the session's open questions, the run's deadline, and the waits for
// answers that come after their ask returned (lateanswer.go).
type questions struct {
	c    *core
	late lateWaits

	// kept is set by Session.Leave: the run's open questions stay open
	// when the session ends, for the adopter's session.
	kept atomic.Bool

	mu       sync.Mutex
	deadline time.Time       // when the run's timeout ends it; zero: unknown
	open     map[string]bool // ids of the session's questions waiting
	asked    bool            // the session stored a question (Close then sweeps)
}

// addQuestionEndpoints adds the ask and reply endpoints to t.
func addQuestionEndpoints(t *endpointTable) {
	of := func(s *Session) *questions { return s.questions }
	add(t, of, endpoint[questions, relay.AskRequest, relay.AskResponse]{
		method: http.MethodPost, path: relay.PathAsk, class: callAsk, decode: relay.DecodeAskRequest, do: (*questions).ask,
		refused: func(req relay.AskRequest) Event { return Event{To: req.To} },
		before: func(w http.ResponseWriter, req relay.AskRequest) {
			// The wait outlasts the socket's write timeout for other calls.
			wait := time.Duration(req.TimeoutSeconds) * time.Second
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + responseWriteTimeout))
		},
	})
	add(t, of, endpoint[questions, relay.ReplyRequest, relay.ReplyResponse]{
		method: http.MethodPost, path: relay.PathReply, class: callAsk, decode: relay.DecodeReplyRequest, do: (*questions).reply,
		refused: func(req relay.ReplyRequest) Event { return Event{QuestionID: req.QuestionID} },
	})
}

// setDeadline records when the run's timeout ends it (Session.SetDeadline).
func (qs *questions) setDeadline(t time.Time) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	qs.deadline = t
}

// bucket returns BucketQuestions.
func (qs *questions) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	return qs.c.h.questions.get(ctx, qs.c.h.js)
}

// newQuestionID returns a fresh question id: "q" and 16 lowercase base32
// characters (80 random bits).
func newQuestionID() string {
	return messages.CoordQuestionIDPrefix + strings.ToLower(rand.Text()[:16])
}

// questionOf returns the question id and choices a run's message carries
// (messages.HeaderQuestion, HeaderChoices), or nothing for a message that is
// not a question.
func questionOf(h nats.Header) (id string, choices []string) {
	id = h.Get(messages.HeaderQuestion)
	if !messages.ValidCoordQuestionID(id) {
		return "", nil
	}
	if c := h.Get(messages.HeaderChoices); c != "" {
		_ = json.Unmarshal([]byte(c), &choices)
	}
	return id, choices
}

// answerOf returns the question id a message answering one carries
// (messages.HeaderAnswerTo: a late answer, deliverLate), or "".
func answerOf(h nats.Header) string {
	if id := h.Get(messages.HeaderAnswerTo); messages.ValidCoordQuestionID(id) {
		return id
	}
	return ""
}

// askWait is how long an ask of timeoutSeconds waits: cut to the run's
// remaining time less askDeadlineMargin, with a note saying so.
func (qs *questions) askWait(timeoutSeconds int) (time.Duration, string) {
	wait := time.Duration(timeoutSeconds) * time.Second
	qs.mu.Lock()
	dl := qs.deadline
	qs.mu.Unlock()
	if dl.IsZero() {
		return wait, ""
	}
	left := time.Until(dl) - askDeadlineMargin
	if left >= wait {
		return wait, ""
	}
	left = max(left, 0).Truncate(time.Second)
	return left, fmt.Sprintf("timeout cut to %d seconds: your run's remaining time", int(left/time.Second))
}

// reserve counts question id among the session's open ones, or
// refuses it past Config.Questions.MaxOpenPerRun.
func (qs *questions) reserve(id string) error {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if n := len(qs.open); n >= qs.c.h.cfg.Questions.MaxOpenPerRun {
		return &apiError{status: http.StatusConflict, code: relay.CodeLimit, msg: fmt.Sprintf(
			"ask refused: a run may have at most %d questions waiting at once and you have %d; wait for their answers; nothing was asked",
			qs.c.h.cfg.Questions.MaxOpenPerRun, n)}
	}
	if qs.open == nil {
		qs.open = map[string]bool{}
	}
	qs.open[id] = true
	return nil
}

// forget removes question id from the session's open ones.
func (qs *questions) forget(id string) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	delete(qs.open, id)
}

// checkGroup refuses a question past
// Config.Questions.MaxOpenPerGroup open questions in the run's group.
func (qs *questions) checkGroup(ctx context.Context, kv jetstream.KeyValue) error {
	keys, err := listKeys(ctx, kv, "ask."+qs.c.run.GroupRef().Key()+".>")
	if err != nil {
		return fmt.Errorf("count questions of group %s: %w", qs.c.run.GroupRef(), err)
	}
	if n := len(keys); n >= qs.c.h.cfg.Questions.MaxOpenPerGroup {
		return &apiError{status: http.StatusConflict, code: relay.CodeLimit, msg: fmt.Sprintf(
			"ask refused: a group may have at most %d questions waiting at once and yours has %d; try again later; nothing was asked",
			qs.c.h.cfg.Questions.MaxOpenPerGroup, n)}
	}
	return nil
}

// listKeys returns the keys of kv matching filter.
func listKeys(ctx context.Context, kv jetstream.KeyValue, filter string) ([]string, error) {
	l, err := kv.ListKeysFiltered(ctx, filter)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = l.Stop() }()
	var keys []string
	for k := range l.Keys() {
		keys = append(keys, k)
	}
	// The lister stops early, without an error, when ctx ends.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return keys, nil
}

// ask puts req's question and waits for its answer, its timeout (cut to
// the run's remaining time) or the end of ctx. A question nobody answers
// is a result (relay.AskNoAnswer), not an error. With req.ReturnAfterSeconds
// shorter than the wait, the call returns AskNoAnswer after it while the
// question stays open for the rest of its wait (awaitLate).
func (qs *questions) ask(ctx context.Context, req relay.AskRequest) (relay.AskResponse, error) {
	if req.To == qs.c.run.RunID {
		return relay.AskResponse{}, &relay.InvalidError{Code: relay.CodeInvalid,
			Message: fmt.Sprintf("to %q is your own run id: ask a peer, %q or %q", req.To, RecipientAll, RecipientOperator)}
	}
	wait, note := qs.askWait(req.TimeoutSeconds)
	if wait < time.Second {
		return relay.AskResponse{Status: relay.AskNoAnswer, Note: "nothing was asked: your run has no time left to wait for an answer"}, nil
	}
	id := newQuestionID()
	if err := qs.reserve(id); err != nil {
		return relay.AskResponse{}, err
	}
	kv, w, q, err := qs.put(ctx, id, req, wait)
	if err != nil {
		qs.forget(id)
		return relay.AskResponse{}, err
	}
	start := time.Now()
	callWait := wait
	if r := time.Duration(req.ReturnAfterSeconds) * time.Second; r > 0 && r < wait {
		callWait = r
	}
	ans, from, why, timedOut := qs.waitAnswer(ctx, w, callWait)
	if why == whyLeft {
		// The question stays open for the session of the worker that
		// adopts the run (resume); the bridge tells the agent its call
		// was interrupted.
		_ = w.Stop()
		qs.forget(id)
		return relay.AskResponse{}, errAskLeft
	}
	resp := relay.AskResponse{QuestionID: id, WaitedSeconds: int64(time.Since(start) / time.Second), Note: note}
	if timedOut && callWait < wait {
		if !qs.awaitLate(kv, w, q, wait-time.Since(start)) {
			return qs.endAsk(ctx, kv, w, q, resp, "", "", "run ended")
		}
		resp.Status = relay.AskNoAnswer
		resp.Note = strings.TrimPrefix(note+"; ", "; ") + fmt.Sprintf(
			"no answer yet: your MCP client sent no progress token, so the call returns after %s, before the client gives up; "+
				"the question stays open until %s, and an answer that comes will be in your inbox (answer_to %s)",
			callWait, q.Until.Format(time.RFC3339), id)
		return resp, nil
	}
	return qs.endAsk(ctx, kv, w, q, resp, ans, from, why)
}

// endAsk ends the wait for q's answer within the call: it stops w, drops
// the question, and completes resp with the answer (from) or why there is
// none.
func (qs *questions) endAsk(ctx context.Context, kv jetstream.KeyValue, w jetstream.KeyWatcher, q messages.CoordQuestion, resp relay.AskResponse, ans, from, why string) (relay.AskResponse, error) {
	defer qs.forget(q.ID)
	_ = w.Stop()
	qs.drop(ctx, kv, messages.CoordQuestionKey(q.GroupRef(), q.RunID, q.ID))
	if why != "" {
		resp.Status = relay.AskNoAnswer
		resp.Note = strings.TrimPrefix(resp.Note+"; ", "; ") + "no answer: " + why
		qs.c.emit(Event{Kind: EventUnanswered, QuestionID: q.ID, To: q.To, Reason: why})
		return resp, nil
	}
	resp.Status, resp.Answer, resp.From = relay.AskAnswered, ans, from
	qs.c.emit(Event{Kind: EventAnswered, QuestionID: q.ID, From: from, Bytes: len(ans)})
	return resp, nil
}

// put checks the recipient and the group's cap, starts watching
// for the answer, stores question id with a TTL and puts it on the group's
// conversation. On success the caller stops the watcher and drops the
// question (drop).
func (qs *questions) put(ctx context.Context, id string, req relay.AskRequest, wait time.Duration) (jetstream.KeyValue, jetstream.KeyWatcher, messages.CoordQuestion, error) {
	octx, cancel := qs.c.opContext(ctx)
	defer cancel()
	var q messages.CoordQuestion
	if req.To != RecipientAll && req.To != RecipientOperator {
		if err := qs.c.checkPeer(octx, req.To); err != nil {
			return nil, nil, q, err
		}
	}
	kv, err := qs.bucket(octx)
	if err != nil {
		return nil, nil, q, err
	}
	if err := qs.checkGroup(octx, kv); err != nil {
		return nil, nil, q, err
	}
	// Watch before the question exists: no answer can come before. The
	// watch outlives the call when the question does (awaitLate); every
	// path stops it, and the session's end does too.
	w, err := kv.WatchFiltered(qs.c.ctx, []string{messages.CoordAnswerKey(id), messages.CoordReplyKey(id)})
	if err != nil {
		return nil, nil, q, fmt.Errorf("watch for answers: %w", err)
	}
	now := time.Now().UTC()
	sess := qs.c.sessionID()
	q = messages.CoordQuestion{ID: id, RunID: qs.c.run.RunID, Group: qs.c.run.Group, Pool: qs.c.run.Pool, To: req.To, Question: req.Question,
		Choices: req.Choices, Time: now, Until: now.Add(wait), Session: sess}
	data, err := json.Marshal(q)
	if err == nil {
		qs.mu.Lock()
		qs.asked = true
		qs.mu.Unlock()
		_, err = kv.Create(octx, messages.CoordQuestionKey(q.GroupRef(), q.RunID, id), data, jetstream.KeyTTL(wait+messages.CoordQuestionGrace))
	}
	if err == nil {
		err = qs.publish(octx, q)
	}
	if err != nil {
		_ = w.Stop()
		qs.drop(ctx, kv, messages.CoordQuestionKey(q.GroupRef(), q.RunID, id))
		return nil, nil, q, fmt.Errorf("ask: %w", err)
	}
	qs.c.emit(Event{Kind: EventAsked, To: q.To, QuestionID: id, Bytes: len(q.Question)})
	return kv, w, q, nil
}

// publish puts q on the group's conversation: a message from the
// run to q.To carrying the question id and choices, sent once per question
// id (its Nats-Msg-Id).
func (qs *questions) publish(ctx context.Context, q messages.CoordQuestion) error {
	msg := &nats.Msg{Subject: Subject(q.GroupRef(), q.To), Header: nats.Header{}, Data: []byte(q.Question)}
	msg.Header.Set(HeaderFrom, qs.c.run.RunID)
	msg.Header.Set(messages.HeaderQuestion, q.ID)
	if len(q.Choices) > 0 {
		b, err := json.Marshal(q.Choices)
		if err != nil {
			return err
		}
		msg.Header.Set(messages.HeaderChoices, string(b))
	}
	if _, err := qs.c.h.js.PublishMsg(ctx, msg, jetstream.WithMsgID("question:"+q.ID)); err != nil {
		return fmt.Errorf("publish question to %s: %w", msg.Subject, err)
	}
	return nil
}

// whyLeft is waitAnswer's why when the session ended by Leave: its worker
// stops and leaves the run running for a successor to adopt. The question
// is neither dropped nor reported unanswered: the adopter's session takes
// it over (resume).
const whyLeft = "the worker left the run to a successor"

// errAskLeft is the error of an ask whose session ended by Leave while it
// waited: the reply says the session ended (relay.CodeSessionEnded,
// core.classify) and the bridge tells the agent the call was interrupted
// and where its answer will come.
var errAskLeft = errors.New("ask: the worker left the run to a successor while the question waited")

// endedWhy is why an answer's wait ended with the session: whyLeft after
// Leave, else "run ended" (Detach, Close).
func (qs *questions) endedWhy() string {
	if qs.kept.Load() {
		return whyLeft
	}
	return "run ended"
}

// waitAnswer waits for the first answer or reply w delivers, for wait or
// until ctx ends. It returns the answer and who gave it (the replying run,
// or RecipientOperator for an answer key whatever its By says), or why
// there is none (timedOut when wait passed; endedWhy when the session
// ended).
func (qs *questions) waitAnswer(ctx context.Context, w jetstream.KeyWatcher, wait time.Duration) (ans, from, why string, timedOut bool) {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				if qs.c.ctx.Err() != nil {
					return "", "", qs.endedWhy(), false
				}
				return "", "", "the worker stopped watching for answers", false
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var a messages.CoordAnswer
			if json.Unmarshal(e.Value(), &a) != nil || a.Answer == "" {
				continue
			}
			if len(a.Answer) > relay.MaxAnswerBytes {
				a.Answer = strings.ToValidUTF8(a.Answer[:relay.MaxAnswerBytes], "")
			}
			from = RecipientOperator
			if strings.HasPrefix(e.Key(), "reply.") && messages.ValidateToken("by", a.By) == nil {
				from = a.By
			}
			return a.Answer, from, "", false
		case <-t.C:
			return "", "", fmt.Sprintf("timeout (%s)", wait), true
		case <-ctx.Done():
			if qs.c.ctx.Err() != nil {
				return "", "", qs.endedWhy(), false
			}
			return "", "", "call ended", false
		}
	}
}

// drop purges the question's key, so the question leaves the open
// list at once and no later reply finds it. It runs even when ctx has
// ended. The answer and reply keys stay until their TTL
// (messages.CoordAnswerTTL): a reply repeated meanwhile meets the first
// one (a duplicate, or refused naming it), never an empty key.
func (qs *questions) drop(ctx context.Context, kv jetstream.KeyValue, key string) {
	ctx, cancel := qs.c.opContext(context.WithoutCancel(ctx))
	defer cancel()
	if err := kv.Purge(ctx, key, jetstream.PurgeTTL(questionMarkerTTL)); err != nil {
		// Its TTL removes it (messages.CoordQuestionGrace).
		qs.c.log.Warn().Err(err).Str("key", key).Msg("purge question key")
	}
}

// expire purges every open question of the run left in
// BucketQuestions, when the run has ended (Close). Each ask call purges its
// own; this catches those of an earlier attempt of the run, and those an
// earlier session of this attempt left to it (resume).
func (qs *questions) expire(ctx context.Context) error {
	qs.mu.Lock()
	asked := qs.asked
	qs.mu.Unlock()
	if !asked {
		return nil
	}
	kv, err := qs.bucket(ctx)
	if err == nil {
		var keys []string
		if keys, err = listKeys(ctx, kv, messages.CoordQuestionKey(qs.c.run.GroupRef(), qs.c.run.RunID, "*")); err == nil {
			for _, k := range keys {
				err = errors.Join(err, kv.Purge(ctx, k, jetstream.PurgeTTL(questionMarkerTTL)))
			}
		}
	}
	if err != nil {
		return fmt.Errorf("coordination: expire questions of run %s: %w", qs.c.run.RunID, err)
	}
	return nil
}
