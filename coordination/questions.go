package coordination

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
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
	if c.Rate == 0 {
		c.Rate = 0.5
	}
	if c.Burst == 0 {
		c.Burst = 5
	}
	if c.MaxOpenPerRun == 0 {
		c.MaxOpenPerRun = 4
	}
	if c.MaxOpenPerGroup == 0 {
		c.MaxOpenPerGroup = 32
	}
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

// questionState is a session's open questions and its run's deadline.
type questionState struct {
	mu       sync.Mutex
	deadline time.Time       // when the run's timeout ends it; zero: unknown
	open     map[string]bool // ids of the session's questions waiting
	asked    bool            // the session stored a question (Close then sweeps)
}

// SetDeadline records when the run's timeout ends it: an ask waits at most
// until shortly before (askDeadlineMargin). The zero time means no limit
// but relay.MaxAskSeconds.
func (s *Session) SetDeadline(t time.Time) {
	s.questions.mu.Lock()
	defer s.questions.mu.Unlock()
	s.questions.deadline = t
}

// questionBucket returns BucketQuestions, looking it up once.
func (h *Host) questionBucket(ctx context.Context) (jetstream.KeyValue, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.questKV != nil {
		return h.questKV, nil
	}
	kv, err := h.js.KeyValue(ctx, BucketQuestions)
	if err != nil {
		return nil, fmt.Errorf("bucket %s (run coordination.Provision first): %w", BucketQuestions, err)
	}
	h.questKV = kv
	return kv, nil
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

// addQuestionRoutes adds the ask and reply endpoints to mux.
func addQuestionRoutes(mux *http.ServeMux) {
	post(mux, relay.PathAsk, endpoint[relay.AskRequest, relay.AskResponse]{
		class: callAsk, decode: relay.DecodeAskRequest, do: (*Session).ask,
		refused: func(req relay.AskRequest) Event { return Event{To: req.To} },
		before: func(w http.ResponseWriter, req relay.AskRequest) {
			// The wait outlasts the socket's write timeout for other calls.
			wait := time.Duration(req.TimeoutSeconds) * time.Second
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + responseWriteTimeout))
		},
	})
	post(mux, relay.PathReply, endpoint[relay.ReplyRequest, relay.ReplyResponse]{
		class: callAsk, decode: relay.DecodeReplyRequest, do: (*Session).replyTo,
		refused: func(req relay.ReplyRequest) Event { return Event{QuestionID: req.QuestionID} },
	})
}

// askWait is how long an ask of timeoutSeconds waits: cut to the run's
// remaining time less askDeadlineMargin, with a note saying so.
func (s *Session) askWait(timeoutSeconds int) (time.Duration, string) {
	wait := time.Duration(timeoutSeconds) * time.Second
	s.questions.mu.Lock()
	dl := s.questions.deadline
	s.questions.mu.Unlock()
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

// reserveQuestion counts question id among the session's open ones, or
// refuses it past Config.Questions.MaxOpenPerRun.
func (s *Session) reserveQuestion(id string) error {
	q := &s.questions
	q.mu.Lock()
	defer q.mu.Unlock()
	if n := len(q.open); n >= s.h.cfg.Questions.MaxOpenPerRun {
		return &apiError{status: http.StatusConflict, code: relay.CodeLimit, msg: fmt.Sprintf(
			"ask refused: a run may have at most %d questions waiting at once and you have %d; wait for their answers; nothing was asked",
			s.h.cfg.Questions.MaxOpenPerRun, n)}
	}
	if q.open == nil {
		q.open = map[string]bool{}
	}
	q.open[id] = true
	return nil
}

// forgetQuestion removes question id from the session's open ones.
func (s *Session) forgetQuestion(id string) {
	s.questions.mu.Lock()
	defer s.questions.mu.Unlock()
	delete(s.questions.open, id)
}

// checkGroupQuestions refuses a question past
// Config.Questions.MaxOpenPerGroup open questions in the run's group.
func (s *Session) checkGroupQuestions(ctx context.Context, kv jetstream.KeyValue) error {
	keys, err := listKeys(ctx, kv, "ask."+s.run.GroupRef().Key()+".>")
	if err != nil {
		return fmt.Errorf("count questions of group %s: %w", s.run.GroupRef(), err)
	}
	if n := len(keys); n >= s.h.cfg.Questions.MaxOpenPerGroup {
		return &apiError{status: http.StatusConflict, code: relay.CodeLimit, msg: fmt.Sprintf(
			"ask refused: a group may have at most %d questions waiting at once and yours has %d; try again later; nothing was asked",
			s.h.cfg.Questions.MaxOpenPerGroup, n)}
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
func (s *Session) ask(ctx context.Context, req relay.AskRequest) (relay.AskResponse, error) {
	if req.To == s.run.RunID {
		return relay.AskResponse{}, &relay.InvalidError{Code: relay.CodeInvalid,
			Message: fmt.Sprintf("to %q is your own run id: ask a peer, %q or %q", req.To, RecipientAll, RecipientOperator)}
	}
	wait, note := s.askWait(req.TimeoutSeconds)
	if wait < time.Second {
		return relay.AskResponse{Status: relay.AskNoAnswer, Note: "nothing was asked: your run has no time left to wait for an answer"}, nil
	}
	id := newQuestionID()
	if err := s.reserveQuestion(id); err != nil {
		return relay.AskResponse{}, err
	}
	kv, w, q, err := s.putQuestion(ctx, id, req, wait)
	if err != nil {
		s.forgetQuestion(id)
		return relay.AskResponse{}, err
	}
	start := time.Now()
	callWait := wait
	if r := time.Duration(req.ReturnAfterSeconds) * time.Second; r > 0 && r < wait {
		callWait = r
	}
	ans, from, why, timedOut := s.waitAnswer(ctx, w, callWait)
	resp := relay.AskResponse{QuestionID: id, WaitedSeconds: int64(time.Since(start) / time.Second), Note: note}
	if timedOut && callWait < wait {
		if !s.awaitLate(kv, w, q, wait-time.Since(start)) {
			return s.endAsk(ctx, kv, w, q, resp, "", "", "run ended")
		}
		resp.Status = relay.AskNoAnswer
		resp.Note = strings.TrimPrefix(note+"; ", "; ") + fmt.Sprintf(
			"no answer yet: your MCP client sent no progress token, so the call returns after %s, before the client gives up; "+
				"the question stays open until %s, and an answer that comes will be in your inbox (answer_to %s)",
			callWait, q.Until.Format(time.RFC3339), id)
		return resp, nil
	}
	return s.endAsk(ctx, kv, w, q, resp, ans, from, why)
}

// endAsk ends the wait for q's answer within the call: it stops w, drops
// the question, and completes resp with the answer (from) or why there is
// none.
func (s *Session) endAsk(ctx context.Context, kv jetstream.KeyValue, w jetstream.KeyWatcher, q messages.CoordQuestion, resp relay.AskResponse, ans, from, why string) (relay.AskResponse, error) {
	defer s.forgetQuestion(q.ID)
	_ = w.Stop()
	s.dropQuestion(ctx, kv, messages.CoordQuestionKey(q.GroupRef(), q.RunID, q.ID))
	if why != "" {
		resp.Status = relay.AskNoAnswer
		resp.Note = strings.TrimPrefix(resp.Note+"; ", "; ") + "no answer: " + why
		s.emit(Event{Kind: EventUnanswered, QuestionID: q.ID, To: q.To, Reason: why})
		return resp, nil
	}
	resp.Status, resp.Answer, resp.From = relay.AskAnswered, ans, from
	s.emit(Event{Kind: EventAnswered, QuestionID: q.ID, From: from, Bytes: len(ans)})
	return resp, nil
}

// putQuestion checks the recipient and the group's cap, starts watching
// for the answer, stores question id with a TTL and puts it on the group's
// conversation. On success the caller stops the watcher and drops the
// question (dropQuestion).
func (s *Session) putQuestion(ctx context.Context, id string, req relay.AskRequest, wait time.Duration) (jetstream.KeyValue, jetstream.KeyWatcher, messages.CoordQuestion, error) {
	octx, cancel := context.WithTimeout(ctx, s.h.cfg.OpTimeout)
	defer cancel()
	var q messages.CoordQuestion
	if req.To != RecipientAll && req.To != RecipientOperator {
		if err := s.checkPeer(octx, req.To); err != nil {
			return nil, nil, q, err
		}
	}
	kv, err := s.h.questionBucket(octx)
	if err != nil {
		return nil, nil, q, err
	}
	if err := s.checkGroupQuestions(octx, kv); err != nil {
		return nil, nil, q, err
	}
	// Watch before the question exists: no answer can come before. The
	// watch outlives the call when the question does (awaitLate); every
	// path stops it, and the session's end does too.
	w, err := kv.WatchFiltered(s.ctx, []string{messages.CoordAnswerKey(id), messages.CoordReplyKey(id)})
	if err != nil {
		return nil, nil, q, fmt.Errorf("watch for answers: %w", err)
	}
	now := time.Now().UTC()
	s.mu.Lock()
	sess := s.presence.Session
	s.mu.Unlock()
	q = messages.CoordQuestion{ID: id, RunID: s.run.RunID, Group: s.run.Group, Pool: s.run.Pool, To: req.To, Question: req.Question,
		Choices: req.Choices, Time: now, Until: now.Add(wait), Session: sess}
	data, err := json.Marshal(q)
	if err == nil {
		s.questions.mu.Lock()
		s.questions.asked = true
		s.questions.mu.Unlock()
		_, err = kv.Create(octx, messages.CoordQuestionKey(q.GroupRef(), q.RunID, id), data, jetstream.KeyTTL(wait+messages.CoordQuestionGrace))
	}
	if err == nil {
		err = s.publishQuestion(octx, q)
	}
	if err != nil {
		_ = w.Stop()
		s.dropQuestion(ctx, kv, messages.CoordQuestionKey(q.GroupRef(), q.RunID, id))
		return nil, nil, q, fmt.Errorf("ask: %w", err)
	}
	s.emit(Event{Kind: EventAsked, To: q.To, QuestionID: id, Bytes: len(q.Question)})
	return kv, w, q, nil
}

// publishQuestion puts q on the group's conversation: a message from the
// run to q.To carrying the question id and choices, sent once per question
// id (its Nats-Msg-Id).
func (s *Session) publishQuestion(ctx context.Context, q messages.CoordQuestion) error {
	msg := &nats.Msg{Subject: Subject(q.GroupRef(), q.To), Header: nats.Header{}, Data: []byte(q.Question)}
	msg.Header.Set(HeaderFrom, s.run.RunID)
	msg.Header.Set(messages.HeaderQuestion, q.ID)
	if len(q.Choices) > 0 {
		b, err := json.Marshal(q.Choices)
		if err != nil {
			return err
		}
		msg.Header.Set(messages.HeaderChoices, string(b))
	}
	if _, err := s.h.js.PublishMsg(ctx, msg, jetstream.WithMsgID("question:"+q.ID)); err != nil {
		return fmt.Errorf("publish question to %s: %w", msg.Subject, err)
	}
	return nil
}

// waitAnswer waits for the first answer or reply w delivers, for wait or
// until ctx ends. It returns the answer and who gave it (the replying run,
// or RecipientOperator for an answer key whatever its By says), or why
// there is none (timedOut when wait passed).
func (s *Session) waitAnswer(ctx context.Context, w jetstream.KeyWatcher, wait time.Duration) (ans, from, why string, timedOut bool) {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
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
			if s.ctx.Err() != nil {
				return "", "", "run ended", false
			}
			return "", "", "call ended", false
		}
	}
}

// dropQuestion purges the question's key, so the question leaves the open
// list at once and no later reply finds it. It runs even when ctx has
// ended. The answer and reply keys stay until their TTL
// (messages.CoordAnswerTTL): a reply repeated meanwhile meets the first
// one (a duplicate, or refused naming it), never an empty key.
func (s *Session) dropQuestion(ctx context.Context, kv jetstream.KeyValue, key string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.h.cfg.OpTimeout)
	defer cancel()
	if err := kv.Purge(ctx, key, jetstream.PurgeTTL(questionMarkerTTL)); err != nil {
		// Its TTL removes it (messages.CoordQuestionGrace).
		s.log.Warn().Err(err).Str("key", key).Msg("purge question key")
	}
}

// expireQuestions purges every open question of the run left in
// BucketQuestions, when the run has ended (Close). Each ask call purges its
// own; this catches those of an earlier attempt of the run.
func (s *Session) expireQuestions(ctx context.Context) error {
	s.questions.mu.Lock()
	asked := s.questions.asked
	s.questions.mu.Unlock()
	if !asked {
		return nil
	}
	kv, err := s.h.questionBucket(ctx)
	if err == nil {
		var keys []string
		if keys, err = listKeys(ctx, kv, messages.CoordQuestionKey(s.run.GroupRef(), s.run.RunID, "*")); err == nil {
			for _, k := range keys {
				err = errors.Join(err, kv.Purge(ctx, k, jetstream.PurgeTTL(questionMarkerTTL)))
			}
		}
	}
	if err != nil {
		return fmt.Errorf("coordination: expire questions of run %s: %w", s.run.RunID, err)
	}
	return nil
}

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

// replyTo answers a peer's question as this run: the first reply wins; the
// same reply again is a duplicate, not an error.
func (s *Session) replyTo(ctx context.Context, req relay.ReplyRequest) (relay.ReplyResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, s.h.cfg.OpTimeout)
	defer cancel()
	kv, err := s.h.questionBucket(ctx)
	if err != nil {
		return relay.ReplyResponse{}, err
	}
	q, err := findQuestion(ctx, kv, req.QuestionID)
	if err == nil && q.GroupRef() != s.run.GroupRef() {
		err = noQuestion(req.QuestionID) // another group's questions are not shown
	}
	if err != nil {
		return relay.ReplyResponse{}, err
	}
	if err := s.mayReply(q); err != nil {
		return relay.ReplyResponse{}, err
	}
	resp := relay.ReplyResponse{QuestionID: q.ID, To: q.RunID}
	a := messages.CoordAnswer{Answer: req.Answer, By: s.run.RunID, Time: time.Now().UTC()}
	data, err := json.Marshal(a)
	if err != nil {
		return resp, err
	}
	_, err = kv.Create(ctx, messages.CoordReplyKey(q.ID), data, jetstream.KeyTTL(messages.CoordAnswerTTL))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return s.replyAgain(ctx, kv, resp, a)
	}
	if err != nil {
		return resp, fmt.Errorf("reply to question %s: %w", q.ID, err)
	}
	s.emit(Event{Kind: EventReplied, To: q.RunID, QuestionID: q.ID, Bytes: len(req.Answer)})
	return resp, nil
}

// mayReply refuses a reply to q by this run unless q is to this run, or to
// "all" from another run.
func (s *Session) mayReply(q messages.CoordQuestion) error {
	refuse := func(why string) error {
		return &apiError{status: http.StatusForbidden, code: relay.CodeInvalid, msg: "reply refused: question " + q.ID + " " + why}
	}
	switch {
	case q.RunID == s.run.RunID:
		return refuse("is your own")
	case q.To == RecipientOperator:
		return refuse("is to the operator: only a person answers it (jetcrew answer)")
	case q.To != RecipientAll && q.To != s.run.RunID:
		return refuse("is to run " + q.To + ", not to you")
	}
	return nil
}

// replyAgain handles a reply to a question that already has one: this run's
// same answer again is a duplicate; anything else is refused, naming who
// answered first.
func (s *Session) replyAgain(ctx context.Context, kv jetstream.KeyValue, resp relay.ReplyResponse, a messages.CoordAnswer) (relay.ReplyResponse, error) {
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
