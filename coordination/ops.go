package coordination

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/internal/origin"
)

// maxOwnAll bounds how many of its own unread "all" messages a session
// remembers for the unread count.
const maxOwnAll = 4096

// status answers the status tool.
func (s *Session) status(ctx context.Context) (relay.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, s.h.cfg.OpTimeout)
	defer cancel()
	info, err := s.consumerInfo(ctx)
	if err != nil {
		return relay.Status{}, err
	}
	s.mu.Lock()
	s.consSeen = time.Now()
	s.mu.Unlock()
	peers, err := s.listPeers(ctx)
	if err != nil {
		return relay.Status{}, err
	}
	unread := int(info.NumPending) + info.NumAckPending - s.ownUnread(info.Delivered.Stream)
	return relay.Status{
		RunID:   s.run.RunID,
		Group:   s.run.Group,
		Profile: s.run.Profile,
		Peers:   peers,
		Unread:  max(0, unread),
	}, nil
}

// listPeers returns the queued and running runs of the group but this one,
// ordered by run id.
func (s *Session) listPeers(ctx context.Context) ([]relay.Peer, error) {
	w, err := s.peers.Watch(ctx, peersOf(s.run.GroupRef()), jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("list peers: %w", err)
	}
	defer func() { _ = w.Stop() }()
	peers := []relay.Peer{}
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("list peers: %w", ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("list peers: watcher stopped")
			}
			if e == nil { // every current key has been delivered
				slices.SortFunc(peers, func(a, b relay.Peer) int { return strings.Compare(a.RunID, b.RunID) })
				return peers, nil
			}
			var p Presence
			if json.Unmarshal(e.Value(), &p) != nil || p.RunID == s.run.RunID || p.State.Final() {
				continue
			}
			peers = append(peers, relay.Peer{RunID: p.RunID, Profile: p.Profile, State: string(p.State), StartedAt: p.StartedAt})
		}
	}
}

// send publishes one message as this run.
func (s *Session) send(ctx context.Context, req relay.SendRequest) (relay.SendResponse, error) {
	if req.To == s.run.RunID {
		return relay.SendResponse{}, &relay.InvalidError{Code: relay.CodeInvalid,
			Message: fmt.Sprintf("to %q is your own run id: send to a peer, %q or %q", req.To, RecipientAll, RecipientOperator)}
	}
	ctx, cancel := context.WithTimeout(ctx, s.h.cfg.OpTimeout)
	defer cancel()
	if req.To != RecipientAll && req.To != RecipientOperator {
		if err := s.checkPeer(ctx, req.To); err != nil {
			return relay.SendResponse{}, err
		}
	}
	msg := &nats.Msg{
		Subject: Subject(s.run.GroupRef(), req.To),
		Header:  nats.Header{},
		Data:    []byte(req.Body),
	}
	// The sender is the socket's run, whatever the request said.
	msg.Header.Set(HeaderFrom, s.run.RunID)
	var opts []jetstream.PublishOpt
	if req.IdempotencyKey != "" {
		opts = append(opts, jetstream.WithMsgID(msgID(s.run.RunID, req.IdempotencyKey)))
	}
	ack, err := s.h.js.PublishMsg(ctx, msg, opts...)
	if err != nil {
		return relay.SendResponse{}, fmt.Errorf("publish to %s: %w", msg.Subject, err)
	}
	if req.To == RecipientAll && !ack.Duplicate {
		s.mu.Lock()
		// Concurrent sends may ack out of order: keep the list sorted.
		i, _ := slices.BinarySearch(s.ownAll, ack.Sequence)
		s.ownAll = slices.Insert(s.ownAll, i, ack.Sequence)
		if len(s.ownAll) > maxOwnAll {
			s.ownAll = s.ownAll[len(s.ownAll)-maxOwnAll:]
		}
		s.mu.Unlock()
	}
	id := strconv.FormatUint(ack.Sequence, 10)
	s.emit(Event{Kind: EventSent, To: req.To, MessageID: id, Bytes: len(req.Body), Duplicate: ack.Duplicate})
	return relay.SendResponse{MessageID: id, Duplicate: ack.Duplicate}, nil
}

// checkPeer reports an *relay.InvalidError unless to is a queued or running
// run of this run's group.
func (s *Session) checkPeer(ctx context.Context, to string) error {
	if s.peerFresh(to) {
		return nil
	}
	unknown := func(why string) error {
		return &relay.InvalidError{Code: relay.CodeUnknownPeer, Message: fmt.Sprintf(
			"unknown peer %q: %s; call status to list your peers, or send to %q or %q", to, why, RecipientAll, RecipientOperator)}
	}
	e, err := s.peers.Get(ctx, PeerKey(s.run.GroupRef(), to))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return unknown(fmt.Sprintf("no queued or running run of your group %q has that id", s.run.Group))
	}
	if err != nil {
		return fmt.Errorf("look up peer %s: %w", to, err)
	}
	var p Presence
	if err := json.Unmarshal(e.Value(), &p); err == nil && p.State.Final() {
		return unknown(fmt.Sprintf("that run has finished (%s)", p.State))
	}
	s.mu.Lock()
	if s.peerSeen == nil || len(s.peerSeen) >= maxPeerSeen {
		s.peerSeen = make(map[string]time.Time)
	}
	s.peerSeen[to] = time.Now()
	s.mu.Unlock()
	return nil
}

// peerCheckTTL is how long a peer checkPeer found queued or running is
// trusted without looking again: a conversation's sends cost one publish
// each, not a lookup and a publish. A peer that ended within it still gets
// the message stored (as an operator's message to it would be).
const peerCheckTTL = 2 * time.Second

// maxPeerSeen bounds the peers remembered per session.
const maxPeerSeen = 256

// peerFresh reports whether checkPeer found to queued or running within
// peerCheckTTL.
func (s *Session) peerFresh(to string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.peerSeen[to]
	return ok && time.Since(t) < peerCheckTTL
}

// msgID returns the Nats-Msg-Id of a send with an idempotency key: scoped by
// the sender, so two runs' keys never collide, and hashed, so any key is a
// valid header value.
func msgID(runID, key string) string {
	sum := sha256.Sum256([]byte(key))
	return runID + ":" + base64.RawURLEncoding.EncodeToString(sum[:18])
}

// minInboxWait is the shortest an inbox call waits for a message when none
// was found at once. A consumer learns of new stream messages
// asynchronously, so a message stored a moment ago may not be offered to an
// immediate pull yet; a short wait lets it through, so that what status
// counts as unread, inbox returns.
const minInboxWait = 150 * time.Millisecond

// inbox returns up to req.Max unread messages, waiting up to req.WaitSeconds
// (at least minInboxWait) for one when none is there, and acknowledges them
// (and this run's own "all" messages, which are skipped). One inbox call runs
// at a time per session.
func (s *Session) inbox(ctx context.Context, req relay.InboxRequest) ([]relay.Message, error) {
	select {
	case s.inboxSem <- struct{}{}:
		defer func() { <-s.inboxSem }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if st := s.h.nc.Status(); st != nats.CONNECTED {
		return nil, fmt.Errorf("read inbox: nats connection is %s", strings.ToLower(st.String()))
	}
	// One round trip that proves NATS and the consumer are there (and
	// recreates a consumer the server deleted): a pull that nobody answers
	// would otherwise read as an empty inbox. Its pending count lags new
	// messages, so it decides nothing else. A consumer proved there within
	// recheckAfter is not asked again: a fetch that fails is (below).
	trusted := s.consumerFresh()
	if !trusted {
		if err := s.proveConsumer(ctx); err != nil {
			return nil, err
		}
	}
	out, got, ferr, err := s.read(ctx, req, trusted)
	if err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		// The bridge went away: hand the messages back rather than mark
		// read what nobody will see.
		for _, m := range got {
			_ = m.Nak()
		}
		return nil, ctx.Err()
	}
	if len(got) == 0 && ferr != nil {
		return nil, fmt.Errorf("read inbox: %w", ferr)
	}
	s.ack(got)
	s.steersRead()
	if len(out) > 0 {
		ids := make([]string, len(out))
		for i, m := range out {
			ids[i] = m.ID
		}
		s.emit(Event{Kind: EventRead, MessageIDs: ids})
	}
	return out, nil
}

// read takes up to req.Max unread messages for inbox: what is there at
// once, else the first to arrive within req.WaitSeconds (at least
// minInboxWait). trusted says the caller skipped proving the consumer
// there (it was proved within recheckAfter): then a failed first fetch
// makes the check (recreating a deleted consumer) and tries once more. It returns the messages for the agent (out), every
// message taken (got: out plus this run's own broadcasts, to acknowledge),
// the error that ended the reading (ferr), and err when the consumer could
// not be proved.
func (s *Session) read(ctx context.Context, req relay.InboxRequest, trusted bool) (out []relay.Message, got []jetstream.Msg, ferr, err error) {
	wait := max(time.Duration(req.WaitSeconds)*time.Second, minInboxWait)
	deadline := time.Now().Add(wait)

	out = []relay.Message{}
	collect := func(m jetstream.Msg) {
		got = append(got, m)
		if msg, skip := s.toMessage(m); !skip {
			out = append(out, msg)
		}
	}
	for ferr == nil && len(out) < req.Max {
		// Take what is there without waiting.
		ferr = s.fetchNoWait(req.Max-len(out), collect)
		if ferr != nil && trusted && len(got) == 0 {
			// The skipped check would have caught this: make it now
			// (recreating a deleted consumer) and try once more.
			trusted = false
			if err := s.proveConsumer(ctx); err != nil {
				return nil, nil, nil, err
			}
			ferr = s.fetchNoWait(req.Max-len(out), collect)
		}
		if ferr != nil || len(out) > 0 || time.Until(deadline) < 10*time.Millisecond {
			break
		}
		// Nothing (or only this run's own broadcasts): wait for the next
		// message, then loop to take whatever else came with it.
		wctx, cancel := context.WithDeadline(ctx, deadline)
		m, err := s.consumer().Next(jetstream.FetchContext(wctx))
		cancel()
		if err != nil {
			if !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
				ferr = err
			}
			break
		}
		collect(m)
	}
	return out, got, ferr, nil
}

// recheckAfter is how long a consumer an inbox or status call proved there
// is trusted without asking the server again. A consumer in use is not
// removed by InactiveThreshold, and a fetch that fails makes the check.
const recheckAfter = 5 * time.Second

// consumerFresh reports whether the inbox consumer was proved there within
// recheckAfter.
func (s *Session) consumerFresh() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cons != nil && time.Since(s.consSeen) < recheckAfter
}

// proveConsumer asks the server for the inbox consumer (creating or
// recreating it) and records when it was found.
func (s *Session) proveConsumer(ctx context.Context) error {
	octx, cancel := context.WithTimeout(ctx, s.h.cfg.OpTimeout)
	defer cancel()
	if _, err := s.consumerInfo(octx); err != nil {
		return err
	}
	s.mu.Lock()
	s.consSeen = time.Now()
	s.mu.Unlock()
	return nil
}

// fetchNoWait passes up to n messages available now to collect.
func (s *Session) fetchNoWait(n int, collect func(jetstream.Msg)) error {
	batch, err := s.consumer().FetchNoWait(n)
	if err != nil {
		return err
	}
	for m := range batch.Messages() {
		collect(m)
	}
	return batch.Error()
}

// ack acknowledges msgs in order: the last one with a confirmed ack, which
// the server processes after the others from the same connection, so the
// unread count is right as soon as inbox returns.
func (s *Session) ack(msgs []jetstream.Msg) {
	if len(msgs) == 0 {
		return
	}
	var err error
	for _, m := range msgs[:len(msgs)-1] {
		err = errors.Join(err, m.Ack())
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.h.cfg.OpTimeout)
	defer cancel()
	err = errors.Join(err, msgs[len(msgs)-1].DoubleAck(ctx))
	if err != nil {
		// Unacknowledged messages come back after AckWait: read twice,
		// never lost.
		s.log.Warn().Err(err).Int("messages", len(msgs)).Msg("acknowledge inbox messages")
	}
}

// toMessage converts a stream message for the agent; skip is true for this
// run's own "all" messages, and for a message the server relayed into the
// run's subjects (origin.Relayed: another stream's RePublish, a source of
// JETCREW_COORD), which no worker or operator published, whatever its
// Jetcrew-From says. Skipped messages are acknowledged all the same.
func (s *Session) toMessage(m jetstream.Msg) (msg relay.Message, skip bool) {
	if origin.Relayed(m.Headers()) {
		s.log.Warn().Str("subject", m.Subject()).Msg("a message relayed into the run's inbox by the server, not published by a worker or an operator: dropped")
		return relay.Message{}, true
	}
	from, to := Sender(m.Subject(), m.Headers().Get(HeaderFrom))
	msg = relay.Message{From: from, To: to, Body: string(m.Data())}
	if from != RecipientOperator {
		msg.QuestionID, msg.Choices = questionOf(m.Headers())
	}
	if msg.QuestionID == "" {
		msg.AnswerTo = answerOf(m.Headers())
	}
	if meta, err := m.Metadata(); err == nil {
		msg.ID = strconv.FormatUint(meta.Sequence.Stream, 10)
		msg.Time = meta.Timestamp.UTC()
	}
	return msg, to == RecipientAll && from == s.run.RunID
}

// consumer returns the inbox consumer handle.
func (s *Session) consumer() jetstream.Consumer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cons
}

// recreateConsumer creates the inbox consumer again after the server deleted
// it. Its DeliverAll policy offers the whole inbox again, read messages
// included: the price of an inbox left unused past InactiveThreshold.
func (s *Session) recreateConsumer(ctx context.Context) (jetstream.Consumer, error) {
	s.log.Warn().Msg("inbox consumer was deleted; recreating it")
	cons, err := s.h.js.CreateOrUpdateConsumer(ctx, StreamName, s.h.inboxConfig(s.run))
	if err != nil {
		return nil, fmt.Errorf("recreate inbox: %w", err)
	}
	s.mu.Lock()
	s.cons = cons
	s.mu.Unlock()
	return cons, nil
}

// consumerInfo returns the inbox consumer's info, creating the consumer on
// the session's first call (or resuming the durable one an earlier session of
// the run left), and recreating it when the server has deleted it
// (InactiveThreshold).
func (s *Session) consumerInfo(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	cons := s.consumer()
	if cons == nil {
		c, err := s.h.js.CreateOrUpdateConsumer(ctx, StreamName, s.h.inboxConfig(s.run))
		if err != nil {
			return nil, fmt.Errorf("inbox consumer of run %s (stream %s, see Provision): %w", s.run.RunID, StreamName, err)
		}
		s.mu.Lock()
		if s.cons == nil {
			s.cons = c
		}
		cons = s.cons
		s.mu.Unlock()
	}
	info, err := cons.Info(ctx)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		if cons, err = s.recreateConsumer(ctx); err != nil {
			return nil, err
		}
		info, err = cons.Info(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("inbox info: %w", err)
	}
	return info, nil
}

// ownUnread forgets this run's own "all" messages at or below the
// consumer's delivered sequence and returns how many remain undelivered.
func (s *Session) ownUnread(delivered uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, _ := slices.BinarySearch(s.ownAll, delivered+1)
	s.ownAll = s.ownAll[i:]
	return len(s.ownAll)
}
