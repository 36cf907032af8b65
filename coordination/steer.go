package coordination

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/time/rate"

	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

// Steering: an operator's message to a running agent (messages.SubjectSteer).
// The session answers the steer requests of its run: it puts the text in the
// run's inbox (an operator message, as `jetcrew send` to a group's run
// would), hands it to the run's launcher when the agent CLI takes streamed
// input (relay.PathSteerNext), which writes it to the CLI's standard input as
// a user turn and acknowledges it (relay.PathSteerAck), and answers with the
// outcome: delivered, queued (inbox only) or refused.

// EventSteered is the event of a steer the session answered
// (messages.CoordSteered).
const EventSteered = messages.CoordSteered

// Limits of steering, per run.
const (
	// SteerRate is the default of Config.SteerRate: how many steers per
	// second a run takes, on average, refused ones included; a steer past
	// it is refused with code rate_limited.
	SteerRate = 1
	// SteerBurst is the default of Config.SteerBurst: how many steers a
	// run takes at once before the rate applies.
	SteerBurst = 5
	// SteerAckTimeout is how long a steer waits for the launcher to write
	// it to the agent's input before it is answered queued (inbox only).
	SteerAckTimeout = 3 * time.Second
	// maxSteerIDs is how many steer ids a session remembers with their
	// outcome, so that a repeated request is answered the same way and
	// delivers nothing new.
	maxSteerIDs = 256
	// steerPending bounds the steer requests waiting in the session's
	// subscription: more are dropped by the client library (their senders
	// time out and see "unavailable").
	steerPending = 64
)

// steerState is one session's steering.
type steerState struct {
	sub     *nats.Subscription
	limiter *rate.Limiter
	events  *rate.Limiter // rate-limited refusal events

	mu     sync.Mutex
	input  bool // the agent CLI takes streamed input (SetSteerInput)
	closed bool // the launcher said the agent's input is closed
	queue  []relay.Steer
	wake   chan struct{} // closed (and replaced) when queue, seq or closed change
	acks   map[string]chan relay.SteerAck
	done   map[string]messages.SteerReply
	order  []string // ids of done, oldest first
	seq    uint64   // steers put in the inbox
	unread int      // of them, not read since
}

// SetSteerInput records whether the run's agent CLI takes streamed input
// (its launcher runs with --steer): steers are then handed to the launcher;
// otherwise they are answered queued at once.
func (s *Session) SetSteerInput(on bool) {
	s.steer.mu.Lock()
	s.steer.input = on
	s.steer.mu.Unlock()
}

// startSteering subscribes to the run's steer subject.
func (s *Session) startSteering() error {
	st := &steerState{
		limiter: rate.NewLimiter(rateLimit(s.h.cfg.SteerRate), s.h.cfg.SteerBurst),
		events:  rate.NewLimiter(rate.Every(refusalEventEvery), 1),
		wake:    make(chan struct{}),
		acks:    map[string]chan relay.SteerAck{},
		done:    map[string]messages.SteerReply{},
	}
	s.steer = st
	sub, err := s.h.nc.Subscribe(messages.SubjectSteer(s.run.RunID), s.onSteer)
	if err != nil {
		return fmt.Errorf("subscribe to steers: %w", err)
	}
	_ = sub.SetPendingLimits(steerPending, steerPending*(messages.MaxSteerBytes+1024))
	st.sub = sub
	return nil
}

// stopSteering ends the subscription; steers waiting for the launcher are
// answered queued by their handler (the session's context has ended).
func (s *Session) stopSteering() {
	if s.steer == nil || s.steer.sub == nil {
		return
	}
	_ = s.steer.sub.Unsubscribe()
}

// broadcast wakes every long poll; st.mu is held.
func (st *steerState) broadcast() {
	close(st.wake)
	st.wake = make(chan struct{})
}

// onSteer answers one steer request.
func (s *Session) onSteer(m *nats.Msg) {
	reply := s.handleSteer(m)
	b, _ := json.Marshal(reply)
	if err := m.Respond(b); err != nil && !errors.Is(err, nats.ErrMsgNoReply) {
		s.log.Warn().Err(err).Msg("answer steer")
	}
}

// handleSteer decides a steer's outcome, storing and delivering it.
func (s *Session) handleSteer(m *nats.Msg) messages.SteerReply {
	st := s.steer
	text := string(m.Data)
	id := m.Header.Get(messages.HeaderSteerID)
	if id == "" {
		id = rand.Text() // no id, no idempotency
	}
	r := messages.SteerReply{RunID: s.run.RunID, ID: id}
	refuse := func(code, reason string) messages.SteerReply {
		r.Outcome, r.Code, r.Reason = messages.SteerRefused, code, reason
		if code != messages.SteerRateLimited || st.events.Allow() {
			s.emit(Event{Kind: EventSteered, SteerID: id, Outcome: r.Outcome, Bytes: len(text), Reason: reason})
		}
		return r
	}
	if err := messages.ValidateSteerID(id); err != nil {
		return refuse(messages.SteerInvalid, err.Error())
	}
	if prev, ok := st.remembered(id); ok {
		prev.Duplicate = true
		s.emit(Event{Kind: EventSteered, SteerID: id, Outcome: prev.Outcome, Bytes: len(text), MessageID: prev.MessageID, Reason: prev.Reason, Duplicate: true})
		return prev
	}
	if code, err := messages.ValidateSteer(text); err != nil {
		return refuse(code, err.Error())
	}
	if !st.limiter.Allow() {
		return refuse(messages.SteerRateLimited, fmt.Sprintf("rate limited: a run takes %s steers per second on average, in bursts of %d; wait a few seconds and send again",
			strconv.FormatFloat(s.h.cfg.SteerRate, 'g', -1, 64), s.h.cfg.SteerBurst))
	}
	s.mu.Lock()
	state := s.presence.State
	s.mu.Unlock()
	if state != messages.StateRunning {
		return refuse(messages.SteerNotRunning, fmt.Sprintf("run %s is %s, not running: a steer reaches only a running agent", s.run.RunID, state))
	}
	if s.ctx.Err() != nil {
		return refuse(messages.SteerUnavailable, "the run's coordination session has ended (the worker is stopping or handing the run back)")
	}
	if st.inputClosed() {
		return refuse(messages.SteerFinishing, fmt.Sprintf("run %s's agent finished its last turn and reads no more input: it is ending", s.run.RunID))
	}
	seq, dup, err := s.storeSteer(id, text)
	if err != nil {
		return refuse(messages.SteerUnavailable, fmt.Sprintf("the worker cannot put the steer in the run's inbox: %v", err))
	}
	r.MessageID = strconv.FormatUint(seq, 10)
	switch {
	case dup:
		// An earlier session of the run stored (and handled) it.
		r.Outcome, r.Duplicate, r.Reason = messages.SteerQueued, true, "an earlier steer with this id is in the run's inbox"
	default:
		st.stored()
		r.Outcome, r.Reason = s.deliverSteer(relay.Steer{ID: id, Text: text})
	}
	st.remember(r)
	s.emit(Event{Kind: EventSteered, SteerID: id, Outcome: r.Outcome, Bytes: len(text), MessageID: r.MessageID, Reason: r.Reason, Duplicate: r.Duplicate})
	return r
}

// storeSteer puts the steer in the run's inbox as a message from the
// operator, its Nats-Msg-Id derived from its id (a repeat within
// DuplicateWindow stores nothing new: dup). The worker publishes it where
// runs' messages travel (jetcrew.coord.<pool>.<group>.<run_id>, which only
// workers may), Jetcrew-From "operator": it acts for the operator whose
// request on jetcrew.steer.<run_id> only operators may send.
func (s *Session) storeSteer(id, text string) (seq uint64, dup bool, err error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.h.cfg.OpTimeout)
	defer cancel()
	msg := nats.NewMsg(Subject(s.run.GroupRef(), s.run.RunID))
	msg.Data = []byte(text)
	msg.Header.Set(HeaderFrom, RecipientOperator)
	msg.Header.Set(messages.HeaderSteerID, id)
	ack, err := s.h.js.PublishMsg(ctx, msg, jetstream.WithMsgID("steer:"+s.run.RunID+":"+id))
	if err != nil {
		return 0, false, err
	}
	return ack.Sequence, ack.Duplicate, nil
}

// deliverSteer hands the steer to the launcher and waits up to
// SteerAckTimeout for it to reach the agent's input.
func (s *Session) deliverSteer(sv relay.Steer) (messages.SteerOutcome, string) {
	st := s.steer
	st.mu.Lock()
	switch {
	case !st.input:
		st.mu.Unlock()
		return messages.SteerQueued, "the run's agent CLI takes no input while it runs: the steer waits in its inbox, and the agent is told so on its next tool call"
	case st.closed: // closed since handleSteer looked
		st.mu.Unlock()
		return messages.SteerQueued, "the agent's input closed meanwhile (its last turn ended): the steer waits in its inbox"
	}
	ack := make(chan relay.SteerAck, 1)
	st.acks[sv.ID] = ack
	st.queue = append(st.queue, sv)
	st.broadcast()
	st.mu.Unlock()

	t := time.NewTimer(SteerAckTimeout)
	defer t.Stop()
	var a relay.SteerAck
	select {
	case a = <-ack:
	case <-t.C:
		a.Reason = fmt.Sprintf("the agent's launcher did not take it within %s: the steer waits in the inbox", SteerAckTimeout)
	case <-s.ctx.Done():
		a.Reason = "the run's coordination session ended: the steer waits in the inbox"
	}
	st.mu.Lock()
	delete(st.acks, sv.ID)
	for i, q := range st.queue {
		if q.ID == sv.ID { // never taken: it will not be written now
			st.queue = append(st.queue[:i], st.queue[i+1:]...)
			break
		}
	}
	st.mu.Unlock()
	if a.Delivered {
		return messages.SteerDelivered, ""
	}
	return messages.SteerQueued, a.Reason
}

// inputClosed reports whether the launcher said the agent's input closed.
func (st *steerState) inputClosed() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.input && st.closed
}

// remembered returns the reply given to an earlier steer with id.
func (st *steerState) remembered(id string) (messages.SteerReply, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	r, ok := st.done[id]
	return r, ok
}

// remember records r for its id, forgetting the oldest past maxSteerIDs.
func (st *steerState) remember(r messages.SteerReply) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, ok := st.done[r.ID]; !ok {
		st.order = append(st.order, r.ID)
	}
	st.done[r.ID] = r
	if len(st.order) > maxSteerIDs {
		delete(st.done, st.order[0])
		st.order = st.order[1:]
	}
}

// stored counts a steer put in the inbox and wakes the notice polls.
func (st *steerState) stored() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.seq++
	st.unread++
	st.broadcast()
}

// steersRead records that the run read its inbox.
func (s *Session) steersRead() {
	if s.steer == nil {
		return
	}
	s.steer.mu.Lock()
	s.steer.unread = 0
	s.steer.mu.Unlock()
}

// unreadSteers returns the steers put in the inbox and not read since.
func (s *Session) unreadSteers() int {
	if s.steer == nil {
		return 0
	}
	s.steer.mu.Lock()
	defer s.steer.mu.Unlock()
	return s.steer.unread
}

// steerNext answers the launcher's long poll: the steers waiting, up to
// relay.MaxSteersPerNext, or none after req.WaitSeconds. A request with
// Closed marks the agent's input closed and answers every waiting steer
// undelivered.
func (s *Session) steerNext(ctx context.Context, req relay.SteerNextRequest) relay.SteerNextResponse {
	st := s.steer
	resp := relay.SteerNextResponse{Steers: []relay.Steer{}}
	dl := time.Now().Add(time.Duration(req.WaitSeconds) * time.Second)
	deadline := time.NewTimer(time.Until(dl))
	defer deadline.Stop()
	st.mu.Lock()
	defer st.mu.Unlock()
	if req.Closed {
		// The launcher acknowledges every steer it took before it reports
		// its input closed: a steer still waiting for its ack was taken by
		// a poll the launcher gave up (or never reached it), and will not
		// be written now.
		st.closed = true
		for id := range st.acks {
			st.ack(relay.SteerAck{ID: id, Reason: "the agent's input closed (its last turn ended): the steer waits in its inbox"})
		}
		st.queue = nil
		return resp
	}
	for len(st.queue) == 0 {
		wake := st.wake
		st.mu.Unlock()
		select {
		case <-wake:
		case <-deadline.C:
		case <-ctx.Done():
		}
		st.mu.Lock()
		if ctx.Err() != nil || len(st.queue) == 0 && !time.Now().Before(dl) {
			return resp
		}
	}
	n := min(len(st.queue), relay.MaxSteersPerNext)
	resp.Steers = append(resp.Steers, st.queue[:n]...)
	st.queue = st.queue[n:]
	return resp
}

// ack passes a launcher's acknowledgement to the steer waiting for it; st.mu
// is held. An ack nobody waits for (the steer timed out) is dropped.
func (st *steerState) ack(a relay.SteerAck) {
	if ch, ok := st.acks[a.ID]; ok {
		select {
		case ch <- a:
		default:
		}
	}
}

// steerAck takes the launcher's acknowledgement of a steer.
func (s *Session) steerAck(a relay.SteerAck) {
	s.steer.mu.Lock()
	defer s.steer.mu.Unlock()
	s.steer.ack(a)
}

// notice answers the bridge's long poll: the steer count once it passes
// req.After, or after req.WaitSeconds.
func (s *Session) notice(ctx context.Context, req relay.NoticeRequest) relay.Notice {
	st := s.steer
	dl := time.Now().Add(time.Duration(req.WaitSeconds) * time.Second)
	deadline := time.NewTimer(time.Until(dl))
	defer deadline.Stop()
	st.mu.Lock()
	defer st.mu.Unlock()
	for st.seq <= req.After {
		wake := st.wake
		st.mu.Unlock()
		select {
		case <-wake:
		case <-deadline.C:
		case <-ctx.Done():
		}
		st.mu.Lock()
		if ctx.Err() != nil || st.seq <= req.After && !time.Now().Before(dl) {
			break
		}
	}
	return relay.Notice{Seq: st.seq, Unread: st.unread}
}

// markUnread sets relay.HeaderUnreadSteers on a reply while steers wait
// unread (the inbox call's own reply says so too: it is set before the
// call reads them).
func (s *Session) markUnread(w http.ResponseWriter) {
	if n := s.unreadSteers(); n > 0 {
		w.Header().Set(relay.HeaderUnreadSteers, strconv.Itoa(n))
	}
}

// fromLauncher reports whether r is one of the launcher's steering calls,
// which do not count as the agent's bridge connecting: the launcher runs
// whether or not the agent starts its MCP server.
func fromLauncher(r *http.Request) bool {
	return r.URL.Path == relay.PathSteerNext || r.URL.Path == relay.PathSteerAck
}

// addSteerRoutes adds the launcher's and the bridge's steering endpoints.
// They are not rate limited as tool calls are: each is a long poll that
// holds one of the socket's MaxConnsPerSession connections, and answers
// at most what the steers' own limit (SteerRate) let in.
func addSteerRoutes(mux *http.ServeMux) {
	post(mux, relay.PathSteerNext, endpoint[relay.SteerNextRequest, relay.SteerNextResponse]{
		class: callFree, decode: relay.DecodeSteerNextRequest,
		do: func(s *Session, ctx context.Context, req relay.SteerNextRequest) (relay.SteerNextResponse, error) {
			return s.steerNext(ctx, req), nil
		},
	})
	mux.HandleFunc("POST "+relay.PathSteerAck, func(w http.ResponseWriter, r *http.Request) {
		s := sessionOf(r)
		data, err := readBody(w, r)
		var a relay.SteerAck
		if err == nil {
			a, err = relay.DecodeSteerAck(data)
		}
		if err != nil {
			s.reply(w, nil, err)
			return
		}
		s.steerAck(a)
		w.WriteHeader(http.StatusNoContent)
	})
	post(mux, relay.PathNotice, endpoint[relay.NoticeRequest, relay.Notice]{
		class: callFree, decode: relay.DecodeNoticeRequest,
		do: func(s *Session, ctx context.Context, req relay.NoticeRequest) (relay.Notice, error) {
			return s.notice(ctx, req), nil
		},
	})
}
