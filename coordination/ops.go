package coordination

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/internal/origin"
)

// maxOwnAll bounds how many of its own unread "all" messages a session
// remembers for the unread count.
const maxOwnAll = 4096

// mailbox is a session's part in its group's conversation: the status, send
// and inbox calls, over the run's durable inbox consumer.
type mailbox struct {
	c      *core
	sem    chan struct{} // one inbox call at a time
	onRead func()        // the run read its inbox (steering counts its steers read)

	mu       sync.Mutex
	cons     jetstream.Consumer
	consSeen time.Time // when an inbox call last proved the consumer there
	ownAll   []uint64  // stream sequences of this run's own "all" messages not yet skipped
}

// newMailbox returns c's mailbox; onRead runs after every inbox call that
// read the inbox.
func newMailbox(c *core, onRead func()) *mailbox {
	return &mailbox{c: c, sem: make(chan struct{}, 1), onRead: onRead}
}

// addMailboxEndpoints adds the status, send and inbox endpoints to t.
func addMailboxEndpoints(t *endpointTable) {
	of := func(s *Session) *mailbox { return s.mail }
	add(t, of, endpoint[mailbox, none, relay.Status]{
		method: http.MethodGet, path: relay.PathStatus, class: callRead,
		do: func(m *mailbox, ctx context.Context, _ none) (relay.Status, error) { return m.status(ctx) },
	})
	add(t, of, endpoint[mailbox, relay.SendRequest, relay.SendResponse]{
		method: http.MethodPost, path: relay.PathSend, class: callSend, decode: relay.DecodeSendRequest, do: (*mailbox).send,
		refused: func(req relay.SendRequest) Event { return Event{To: req.To} },
	})
	add(t, of, endpoint[mailbox, relay.InboxRequest, relay.InboxResponse]{
		method: http.MethodPost, path: relay.PathInbox, class: callRead, decode: relay.DecodeInboxRequest,
		do: func(m *mailbox, ctx context.Context, req relay.InboxRequest) (relay.InboxResponse, error) {
			msgs, err := m.inbox(ctx, req)
			return relay.InboxResponse{Messages: msgs}, err
		},
		refused: func(relay.InboxRequest) Event { return Event{} },
	})
}

// status answers the status tool.
func (m *mailbox) status(ctx context.Context) (relay.Status, error) {
	ctx, cancel := m.c.opContext(ctx)
	defer cancel()
	info, err := m.consumerInfo(ctx)
	if err != nil {
		return relay.Status{}, err
	}
	m.mu.Lock()
	m.consSeen = time.Now()
	m.mu.Unlock()
	peers, err := m.c.listPeers(ctx)
	if err != nil {
		return relay.Status{}, err
	}
	unread := int(info.NumPending) + info.NumAckPending - m.ownUnread(info.Delivered.Stream)
	run := m.c.run
	return relay.Status{
		RunID:   run.RunID,
		Group:   run.Group,
		Profile: run.Profile,
		Peers:   peers,
		Unread:  max(0, unread),
	}, nil
}

// send publishes one message as this run.
func (m *mailbox) send(ctx context.Context, req relay.SendRequest) (relay.SendResponse, error) {
	c := m.c
	if req.To == c.run.RunID {
		return relay.SendResponse{}, &relay.InvalidError{Code: relay.CodeInvalid,
			Message: fmt.Sprintf("to %q is your own run id: send to a peer, %q or %q", req.To, RecipientAll, RecipientOperator)}
	}
	ctx, cancel := c.opContext(ctx)
	defer cancel()
	if req.To != RecipientAll && req.To != RecipientOperator {
		if err := c.checkPeer(ctx, req.To); err != nil {
			return relay.SendResponse{}, err
		}
	}
	msg := &nats.Msg{
		Subject: Subject(c.run.GroupRef(), req.To),
		Header:  nats.Header{},
		Data:    []byte(req.Body),
	}
	// The sender is the socket's run, whatever the request said.
	msg.Header.Set(HeaderFrom, c.run.RunID)
	var opts []jetstream.PublishOpt
	if req.IdempotencyKey != "" {
		opts = append(opts, jetstream.WithMsgID(msgID(c.run.RunID, req.IdempotencyKey)))
	}
	ack, err := c.h.js.PublishMsg(ctx, msg, opts...)
	if err != nil {
		return relay.SendResponse{}, fmt.Errorf("publish to %s: %w", msg.Subject, err)
	}
	if req.To == RecipientAll && !ack.Duplicate {
		m.sentAll(ack.Sequence)
	}
	id := strconv.FormatUint(ack.Sequence, 10)
	c.emit(Event{Kind: EventSent, To: req.To, MessageID: id, Bytes: len(req.Body), Duplicate: ack.Duplicate})
	return relay.SendResponse{MessageID: id, Duplicate: ack.Duplicate}, nil
}

// sentAll remembers seq, the stream sequence of this run's own "all"
// message, which its inbox skips and its unread count leaves out.
func (m *mailbox) sentAll(seq uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	// Concurrent sends may ack out of order: keep the list sorted.
	i, _ := slices.BinarySearch(m.ownAll, seq)
	m.ownAll = slices.Insert(m.ownAll, i, seq)
	if len(m.ownAll) > maxOwnAll {
		m.ownAll = m.ownAll[len(m.ownAll)-maxOwnAll:]
	}
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
func (m *mailbox) inbox(ctx context.Context, req relay.InboxRequest) ([]relay.Message, error) {
	select {
	case m.sem <- struct{}{}:
		defer func() { <-m.sem }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if st := m.c.h.nc.Status(); st != nats.CONNECTED {
		return nil, fmt.Errorf("read inbox: nats connection is %s", strings.ToLower(st.String()))
	}
	// One round trip that proves NATS and the consumer are there (and
	// recreates a consumer the server deleted): a pull that nobody answers
	// would otherwise read as an empty inbox. Its pending count lags new
	// messages, so it decides nothing else. A consumer proved there within
	// recheckAfter is not asked again: a fetch that fails is (below).
	trusted := m.consumerFresh()
	if !trusted {
		if err := m.proveConsumer(ctx); err != nil {
			return nil, err
		}
	}
	out, got, ferr, err := m.read(ctx, req, trusted)
	if err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		// The bridge went away: hand the messages back rather than mark
		// read what nobody will see.
		for _, msg := range got {
			_ = msg.Nak()
		}
		return nil, ctx.Err()
	}
	if len(got) == 0 && ferr != nil {
		return nil, fmt.Errorf("read inbox: %w", ferr)
	}
	m.ack(got)
	m.onRead()
	if len(out) > 0 {
		ids := make([]string, len(out))
		for i, msg := range out {
			ids[i] = msg.ID
		}
		m.c.emit(Event{Kind: EventRead, MessageIDs: ids})
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
func (m *mailbox) read(ctx context.Context, req relay.InboxRequest, trusted bool) (out []relay.Message, got []jetstream.Msg, ferr, err error) {
	wait := max(time.Duration(req.WaitSeconds)*time.Second, minInboxWait)
	deadline := time.Now().Add(wait)

	out = []relay.Message{}
	collect := func(msg jetstream.Msg) {
		got = append(got, msg)
		if rm, skip := m.toMessage(msg); !skip {
			out = append(out, rm)
		}
	}
	for ferr == nil && len(out) < req.Max {
		// Take what is there without waiting.
		ferr = m.fetchNoWait(req.Max-len(out), collect)
		if ferr != nil && trusted && len(got) == 0 {
			// The skipped check would have caught this: make it now
			// (recreating a deleted consumer) and try once more.
			trusted = false
			if err := m.proveConsumer(ctx); err != nil {
				return nil, nil, nil, err
			}
			ferr = m.fetchNoWait(req.Max-len(out), collect)
		}
		if ferr != nil || len(out) > 0 || time.Until(deadline) < 10*time.Millisecond {
			break
		}
		// Nothing (or only this run's own broadcasts): wait for the next
		// message, then loop to take whatever else came with it.
		wctx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := m.consumer().Next(jetstream.FetchContext(wctx))
		cancel()
		if err != nil {
			if !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
				ferr = err
			}
			break
		}
		collect(msg)
	}
	return out, got, ferr, nil
}

// recheckAfter is how long a consumer an inbox or status call proved there
// is trusted without asking the server again. A consumer in use is not
// removed by InactiveThreshold, and a fetch that fails makes the check.
const recheckAfter = 5 * time.Second

// consumerFresh reports whether the inbox consumer was proved there within
// recheckAfter.
func (m *mailbox) consumerFresh() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cons != nil && time.Since(m.consSeen) < recheckAfter
}

// proveConsumer asks the server for the inbox consumer (creating or
// recreating it) and records when it was found.
func (m *mailbox) proveConsumer(ctx context.Context) error {
	octx, cancel := m.c.opContext(ctx)
	defer cancel()
	if _, err := m.consumerInfo(octx); err != nil {
		return err
	}
	m.mu.Lock()
	m.consSeen = time.Now()
	m.mu.Unlock()
	return nil
}

// fetchNoWait passes up to n messages available now to collect.
func (m *mailbox) fetchNoWait(n int, collect func(jetstream.Msg)) error {
	batch, err := m.consumer().FetchNoWait(n)
	if err != nil {
		return err
	}
	for msg := range batch.Messages() {
		collect(msg)
	}
	return batch.Error()
}

// ack acknowledges msgs in order: the last one with a confirmed ack, which
// the server processes after the others from the same connection, so the
// unread count is right as soon as inbox returns.
func (m *mailbox) ack(msgs []jetstream.Msg) {
	if len(msgs) == 0 {
		return
	}
	var err error
	for _, msg := range msgs[:len(msgs)-1] {
		err = errors.Join(err, msg.Ack())
	}
	ctx, cancel := m.c.opContext(m.c.ctx)
	defer cancel()
	err = errors.Join(err, msgs[len(msgs)-1].DoubleAck(ctx))
	if err != nil {
		// Unacknowledged messages come back after AckWait: read twice,
		// never lost.
		m.c.log.Warn().Err(err).Int("messages", len(msgs)).Msg("acknowledge inbox messages")
	}
}

// toMessage converts a stream message for the agent; skip is true for this
// run's own "all" messages, and for a message the server relayed into the
// run's subjects (origin.Relayed: another stream's RePublish, a source of
// JETCREW_COORD), which no worker or operator published, whatever its
// Jetcrew-From says. Skipped messages are acknowledged all the same.
func (m *mailbox) toMessage(sm jetstream.Msg) (msg relay.Message, skip bool) {
	if origin.Relayed(sm.Headers()) {
		m.c.log.Warn().Str("subject", sm.Subject()).Msg("a message relayed into the run's inbox by the server, not published by a worker or an operator: dropped")
		return relay.Message{}, true
	}
	from, to := Sender(sm.Subject(), sm.Headers().Get(HeaderFrom))
	msg = relay.Message{From: from, To: to, Body: string(sm.Data())}
	if from != RecipientOperator {
		msg.QuestionID, msg.Choices = questionOf(sm.Headers())
	}
	if msg.QuestionID == "" {
		msg.AnswerTo = answerOf(sm.Headers())
	}
	if meta, err := sm.Metadata(); err == nil {
		msg.ID = strconv.FormatUint(meta.Sequence.Stream, 10)
		msg.Time = meta.Timestamp.UTC()
	}
	return msg, to == RecipientAll && from == m.c.run.RunID
}

// consumer returns the inbox consumer handle; nil until the session's
// first status or inbox call.
func (m *mailbox) consumer() jetstream.Consumer {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cons
}

// consumerInfo returns the inbox consumer's info, creating the consumer on
// the session's first call (or resuming the durable one an earlier session of
// the run left), and recreating it when the server has deleted it
// (InactiveThreshold): its DeliverAll policy then offers the whole inbox
// again, read messages included, the price of an inbox left unused past
// InactiveThreshold.
func (m *mailbox) consumerInfo(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	c := m.c
	cons := m.consumer()
	if cons == nil {
		created, err := c.h.js.CreateOrUpdateConsumer(ctx, StreamName, c.h.inboxConfig(c.run))
		if err != nil {
			return nil, fmt.Errorf("inbox consumer of run %s (stream %s, see Provision): %w", c.run.RunID, StreamName, err)
		}
		m.mu.Lock()
		if m.cons == nil {
			m.cons = created
		}
		cons = m.cons
		m.mu.Unlock()
	}
	info, err := cons.Info(ctx)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		c.log.Warn().Msg("inbox consumer was deleted; recreating it")
		if cons, err = c.h.js.CreateOrUpdateConsumer(ctx, StreamName, c.h.inboxConfig(c.run)); err != nil {
			return nil, fmt.Errorf("recreate inbox: %w", err)
		}
		m.mu.Lock()
		m.cons = cons
		m.mu.Unlock()
		info, err = cons.Info(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("inbox info: %w", err)
	}
	return info, nil
}

// ownUnread forgets this run's own "all" messages at or below the
// consumer's delivered sequence and returns how many remain undelivered.
func (m *mailbox) ownUnread(delivered uint64) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, _ := slices.BinarySearch(m.ownAll, delivered+1)
	m.ownAll = m.ownAll[i:]
	return len(m.ownAll)
}

// remove deletes the run's inbox consumer, when the run has ended (Close),
// if this session used it; unread messages stay in the stream until
// MaxAge.
func (m *mailbox) remove(ctx context.Context) error {
	if m.consumer() == nil {
		return nil
	}
	err := m.c.h.js.DeleteConsumer(ctx, StreamName, InboxName(m.c.run.RunID))
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("coordination: delete inbox of run %s: %w", m.c.run.RunID, err)
	}
	return nil
}
