package runner

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// leaseMsg is the request of an adopted run as the run sees it: the
// request read back from its stream (by the stream sequence its record
// names), acknowledged on the lease its record names
// (messages.RunState.Lease), the reply subject of the delivery that held
// the run before its worker stopped or died. The server acts on an ack,
// a nak, a term or an in-progress by the stream sequence the subject
// names, whichever delivery of the message it was (nats-server's
// consumer: processAckMsg and progressUpdate look the sequence up in the
// pending set), so the adopter keeps the request in progress and removes
// it as the worker that started the run would have. The bodies are the
// JetStream acknowledgement protocol's (+ACK, -NAK, +WPI, +TERM), as
// nats.go's jetstream.Msg sends them.
type leaseMsg struct {
	nc      *nats.Conn
	subject string
	data    []byte
	header  nats.Header
	meta    jetstream.MsgMetadata

	mu    sync.Mutex
	reply string
	acked bool
}

var _ jetstream.Msg = (*leaseMsg)(nil)

// Metadata returns the delivery's metadata as the run's record has it:
// the request's stream sequence, the attempt as the delivery count, the
// time it was queued.
func (m *leaseMsg) Metadata() (*jetstream.MsgMetadata, error) {
	meta := m.meta
	return &meta, nil
}

// Data returns the request's body.
func (m *leaseMsg) Data() []byte { return m.data }

// Headers returns the request's headers.
func (m *leaseMsg) Headers() nats.Header { return m.header }

// Subject returns the subject the request was published to.
func (m *leaseMsg) Subject() string { return m.subject }

// Reply returns the lease: the acknowledgement subject.
func (m *leaseMsg) Reply() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reply
}

// send publishes body on the lease; final marks the request settled
// (later acknowledgements fail with jetstream.ErrMsgAlreadyAckd, as
// jetstream.Msg's do).
func (m *leaseMsg) send(ctx context.Context, body string, final, sync bool) error {
	m.mu.Lock()
	reply, acked := m.reply, m.acked
	m.mu.Unlock()
	if acked {
		return jetstream.ErrMsgAlreadyAckd
	}
	if reply == "" {
		return jetstream.ErrMsgNoReply
	}
	var err error
	if sync {
		_, err = m.nc.RequestWithContext(ctx, reply, []byte(body))
	} else {
		err = m.nc.Publish(reply, []byte(body))
	}
	if err == nil && final {
		m.mu.Lock()
		m.acked = true
		m.mu.Unlock()
	}
	return err
}

// Ack acknowledges the request (+ACK).
func (m *leaseMsg) Ack() error { return m.send(context.Background(), "+ACK", true, false) }

// DoubleAck acknowledges the request and waits for the server's answer.
func (m *leaseMsg) DoubleAck(ctx context.Context) error { return m.send(ctx, "+ACK", true, true) }

// Nak hands the request back for redelivery (-NAK).
func (m *leaseMsg) Nak() error { return m.send(context.Background(), "-NAK", true, false) }

// NakWithDelay hands the request back, redelivered after delay.
func (m *leaseMsg) NakWithDelay(delay time.Duration) error {
	return m.send(context.Background(), fmt.Sprintf(`-NAK {"delay": %d}`, delay.Nanoseconds()), true, false)
}

// InProgress resets the request's ack wait (+WPI).
func (m *leaseMsg) InProgress() error { return m.send(context.Background(), "+WPI", false, false) }

// Term removes the request without redelivery (+TERM).
func (m *leaseMsg) Term() error { return m.send(context.Background(), "+TERM", true, false) }

// TermWithReason removes the request, saying why.
func (m *leaseMsg) TermWithReason(reason string) error {
	return m.send(context.Background(), "+TERM "+reason, true, false)
}
