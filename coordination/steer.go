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

// steering is a session's steering: its subscription to the run's steer
// subject, the steers waiting for the launcher, and the long polls of the
// launcher (next, ack) and the bridge (notice).
type steering struct {
	c       *core
	epoch   string // names this session's count of steers (relay.Notice.Session)
	sub     *nats.Subscription
	limiter *rate.Limiter
	events  *rate.Limiter // rate-limited refusal events

	mu     sync.Mutex
	input  bool // the agent CLI takes streamed input (Session.SetSteerInput)
	closed bool // the launcher said the agent's input is closed
	queue  []relay.Steer
	wake   chan struct{} // closed (and replaced) when queue, seq or closed change
	polls  int           // long polls waiting for a wake
	acks   map[string]chan relay.SteerAck
	done   map[string]messages.SteerReply
	order  []string // ids of done, oldest first
	seq    uint64   // steers put in the inbox
	unread int      // of them, not read since
}

// newSteering returns c's steering, not yet subscribed (start).
func newSteering(c *core) *steering {
	return &steering{
		c:       c,
		epoch:   rand.Text(),
		limiter: rate.NewLimiter(rateLimit(c.h.cfg.SteerRate), c.h.cfg.SteerBurst),
		events:  rate.NewLimiter(rate.Every(refusalEventEvery), 1),
		wake:    make(chan struct{}),
		acks:    map[string]chan relay.SteerAck{},
		done:    map[string]messages.SteerReply{},
	}
}

// addSteerEndpoints adds the launcher's and the bridge's steering endpoints
// to t. They are not rate limited as tool calls are: each is a long poll
// that holds one of the socket's MaxConnsPerSession connections, and
// answers at most what the steers' own limit (SteerRate) let in.
func addSteerEndpoints(t *endpointTable) {
	of := func(s *Session) *steering { return s.steer }
	add(t, of, endpoint[steering, relay.SteerNextRequest, relay.SteerNextResponse]{
		method: http.MethodPost, path: relay.PathSteerNext, class: callFree, decode: relay.DecodeSteerNextRequest,
		do: (*steering).next,
	})
	add(t, of, endpoint[steering, relay.SteerAck, noContent]{
		method: http.MethodPost, path: relay.PathSteerAck, class: callFree, decode: relay.DecodeSteerAck,
		do: (*steering).takeAck,
	})
	add(t, of, endpoint[steering, relay.NoticeRequest, relay.Notice]{
		method: http.MethodPost, path: relay.PathNotice, class: callFree, decode: relay.DecodeNoticeRequest,
		do: (*steering).notice,
	})
}

// fromLauncher reports whether r is one of the launcher's steering calls,
// which do not count as the agent's bridge connecting: the launcher runs
// whether or not the agent starts its MCP server.
func fromLauncher(r *http.Request) bool {
	return r.URL.Path == relay.PathSteerNext || r.URL.Path == relay.PathSteerAck
}

// start subscribes to the run's steer subject.
func (st *steering) start() error {
	sub, err := st.c.h.nc.Subscribe(messages.SubjectSteer(st.c.run.RunID), st.onSteer)
	if err != nil {
		return fmt.Errorf("subscribe to steers: %w", err)
	}
	_ = sub.SetPendingLimits(steerPending, steerPending*(messages.MaxSteerBytes+1024))
	st.sub = sub
	return nil
}

// stop ends the subscription; steers waiting for the launcher are answered
// queued by their handler (the session's context has ended).
func (st *steering) stop() {
	if st.sub != nil {
		_ = st.sub.Unsubscribe()
	}
}

// setInput records whether the agent CLI takes streamed input.
func (st *steering) setInput(on bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.input = on
}

// broadcast wakes every long poll; st.mu is held.
func (st *steering) broadcast() {
	close(st.wake)
	st.wake = make(chan struct{})
}

// onSteer answers one steer request.
func (st *steering) onSteer(m *nats.Msg) {
	reply := st.handle(m)
	b, _ := json.Marshal(reply)
	if err := m.Respond(b); err != nil && !errors.Is(err, nats.ErrMsgNoReply) {
		st.c.log.Warn().Err(err).Msg("answer steer")
	}
}

// handle decides a steer's outcome, storing and delivering it.
func (st *steering) handle(m *nats.Msg) messages.SteerReply {
	text := string(m.Data)
	id := m.Header.Get(messages.HeaderSteerID)
	if id == "" {
		id = rand.Text() // no id, no idempotency
	}
	r := messages.SteerReply{RunID: st.c.run.RunID, ID: id}
	if err := messages.ValidateSteerID(id); err != nil {
		return st.refuse(r, len(text), messages.SteerInvalid, err.Error())
	}
	if prev, ok := st.remembered(id); ok {
		prev.Duplicate = true
		st.c.emit(Event{Kind: EventSteered, SteerID: id, Outcome: prev.Outcome, Bytes: len(text), MessageID: prev.MessageID, Reason: prev.Reason, Duplicate: true})
		return prev
	}
	if code, reason := st.admit(text); code != "" {
		return st.refuse(r, len(text), code, reason)
	}
	seq, dup, err := st.store(id, text)
	if err != nil {
		return st.refuse(r, len(text), messages.SteerUnavailable, fmt.Sprintf("the worker cannot put the steer in the run's inbox: %v", err))
	}
	r.MessageID = strconv.FormatUint(seq, 10)
	switch {
	case dup:
		// An earlier session of the run stored (and handled) it.
		r.Outcome, r.Duplicate, r.Reason = messages.SteerQueued, true, "an earlier steer with this id is in the run's inbox"
	default:
		st.stored()
		r.Outcome, r.Reason = st.deliver(relay.Steer{ID: id, Text: text})
	}
	st.remember(r)
	st.c.emit(Event{Kind: EventSteered, SteerID: id, Outcome: r.Outcome, Bytes: len(text), MessageID: r.MessageID, Reason: r.Reason, Duplicate: r.Duplicate})
	return r
}

// admit returns the code and reason of refusing a new steer of text, or ""
// when the run takes it: valid text, within the rate, a running run whose
// session serves and whose agent still reads input.
func (st *steering) admit(text string) (code, reason string) {
	c := st.c
	if code, err := messages.ValidateSteer(text); err != nil {
		return code, err.Error()
	}
	if !st.limiter.Allow() {
		return messages.SteerRateLimited, fmt.Sprintf("rate limited: a run takes %s steers per second on average, in bursts of %d; wait a few seconds and send again",
			strconv.FormatFloat(c.h.cfg.SteerRate, 'g', -1, 64), c.h.cfg.SteerBurst)
	}
	if state := c.state(); state != messages.StateRunning {
		return messages.SteerNotRunning, fmt.Sprintf("run %s is %s, not running: a steer reaches only a running agent", c.run.RunID, state)
	}
	if c.ctx.Err() != nil {
		return messages.SteerUnavailable, "the run's coordination session has ended (the worker is stopping or handing the run back)"
	}
	if st.inputClosed() {
		return messages.SteerFinishing, fmt.Sprintf("run %s's agent finished its last turn and reads no more input: it is ending", c.run.RunID)
	}
	return "", ""
}

// refuse completes r as refused with code and reason, recording the event
// (a rate-limited refusal only as often as refusalEventEvery allows).
func (st *steering) refuse(r messages.SteerReply, bytes int, code, reason string) messages.SteerReply {
	r.Outcome, r.Code, r.Reason = messages.SteerRefused, code, reason
	if code != messages.SteerRateLimited || st.events.Allow() {
		st.c.emit(Event{Kind: EventSteered, SteerID: r.ID, Outcome: r.Outcome, Bytes: bytes, Reason: reason})
	}
	return r
}

// store puts the steer in the run's inbox as a message from the
// operator, its Nats-Msg-Id derived from its id (a repeat within
// DuplicateWindow stores nothing new: dup). The worker publishes it where
// runs' messages travel (jetcrew.coord.<pool>.<group>.<run_id>, which only
// workers may), Jetcrew-From "operator": it acts for the operator whose
// request on jetcrew.steer.<run_id> only operators may send.
func (st *steering) store(id, text string) (seq uint64, dup bool, err error) {
	c := st.c
	ctx, cancel := c.opContext(c.ctx)
	defer cancel()
	msg := nats.NewMsg(Subject(c.run.GroupRef(), c.run.RunID))
	msg.Data = []byte(text)
	msg.Header.Set(HeaderFrom, RecipientOperator)
	msg.Header.Set(messages.HeaderSteerID, id)
	ack, err := c.h.js.PublishMsg(ctx, msg, jetstream.WithMsgID("steer:"+c.run.RunID+":"+id))
	if err != nil {
		return 0, false, err
	}
	return ack.Sequence, ack.Duplicate, nil
}

// deliver hands the steer to the launcher and waits up to SteerAckTimeout
// for it to reach the agent's input.
func (st *steering) deliver(sv relay.Steer) (messages.SteerOutcome, string) {
	st.mu.Lock()
	switch {
	case !st.input:
		st.mu.Unlock()
		return messages.SteerQueued, "the run's agent CLI takes no input while it runs: the steer waits in its inbox, and the agent is told so on its next tool call"
	case st.closed: // closed since handle looked
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
	case <-st.c.ctx.Done():
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
func (st *steering) inputClosed() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.input && st.closed
}

// remembered returns the reply given to an earlier steer with id.
func (st *steering) remembered(id string) (messages.SteerReply, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	r, ok := st.done[id]
	return r, ok
}

// remember records r for its id, forgetting the oldest past maxSteerIDs.
func (st *steering) remember(r messages.SteerReply) {
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
func (st *steering) stored() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.seq++
	st.unread++
	st.broadcast()
}

// read records that the run read its inbox.
func (st *steering) read() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.unread = 0
}

// markUnread sets relay.HeaderUnreadSteers on a reply while steers wait
// unread (the inbox call's own reply says so too: it is set before the
// call reads them).
func (st *steering) markUnread(w http.ResponseWriter) {
	st.mu.Lock()
	n := st.unread
	st.mu.Unlock()
	if n > 0 {
		w.Header().Set(relay.HeaderUnreadSteers, strconv.Itoa(n))
	}
}

// waitFor waits until ready holds, for a wake (broadcast), up to
// waitSeconds or until ctx ends; st.mu is held on entry and on return.
// The long polls of the launcher (next) and the bridge (notice) wait here.
func (st *steering) waitFor(ctx context.Context, waitSeconds int, ready func() bool) {
	dl := time.Now().Add(time.Duration(waitSeconds) * time.Second)
	deadline := time.NewTimer(time.Until(dl))
	defer deadline.Stop()
	for !ready() {
		wake := st.wake
		st.polls++
		st.mu.Unlock()
		select {
		case <-wake:
		case <-deadline.C:
		case <-ctx.Done():
		}
		st.mu.Lock()
		st.polls--
		if ctx.Err() != nil || !ready() && !time.Now().Before(dl) {
			return
		}
	}
}

// next answers the launcher's long poll: the steers waiting, up to
// relay.MaxSteersPerNext, or none after req.WaitSeconds. A request with
// Closed marks the agent's input closed and answers every waiting steer
// undelivered.
func (st *steering) next(ctx context.Context, req relay.SteerNextRequest) (relay.SteerNextResponse, error) {
	resp := relay.SteerNextResponse{Steers: []relay.Steer{}}
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
		return resp, nil
	}
	st.waitFor(ctx, req.WaitSeconds, func() bool { return len(st.queue) > 0 })
	if ctx.Err() != nil {
		return resp, nil
	}
	n := min(len(st.queue), relay.MaxSteersPerNext)
	resp.Steers = append(resp.Steers, st.queue[:n]...)
	st.queue = st.queue[n:]
	return resp, nil
}

// ack passes a launcher's acknowledgement to the steer waiting for it; st.mu
// is held. An ack nobody waits for (the steer timed out) is dropped.
func (st *steering) ack(a relay.SteerAck) {
	if ch, ok := st.acks[a.ID]; ok {
		select {
		case ch <- a:
		default:
		}
	}
}

// takeAck takes the launcher's acknowledgement of a steer.
func (st *steering) takeAck(_ context.Context, a relay.SteerAck) (noContent, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.ack(a)
	return noContent{}, nil
}

// notice answers the bridge's long poll: the steer count once it passes
// req.After, or after req.WaitSeconds. A req.After counted by another
// session (the bridge's worker was replaced) counts from 0 here.
func (st *steering) notice(ctx context.Context, req relay.NoticeRequest) (relay.Notice, error) {
	after := req.After
	if req.Session != "" && req.Session != st.epoch {
		after = 0
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.waitFor(ctx, req.WaitSeconds, func() bool { return st.seq > after })
	return relay.Notice{Seq: st.seq, Unread: st.unread, Session: st.epoch}, nil
}
