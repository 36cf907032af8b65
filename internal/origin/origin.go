// Package origin tells a message a client published into a stream from one
// the server relayed there on a stream's behalf, and reads a subject's
// newest published message.
//
// A stream's RePublish and its sources are publishes by the server, which
// no user's permissions see: a stream republishing to $KV.jetcrew-runs.<run>
// writes that run's state, one republishing to jetcrew.coord.<pool>.<group>.<run>
// puts a message in that run's inbox. Only workers may configure jetcrew's
// streams (package roles: that is the boundary); what the server relays
// carries stamps no publish of a worker's does, and the readers of run
// states, events and inboxes refuse it as a second line, for a server whose
// permissions let someone else configure a stream.
package origin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Headers the server stamps on the messages it relays.
const (
	// HeaderSource is on every message a stream stored from one of its
	// sources; the server refuses a client's publish that carries it.
	HeaderSource = "Nats-Stream-Source"
	// HeaderLastSequence is on every message a stream's RePublish
	// published (with Nats-Stream, Nats-Subject, Nats-Sequence and
	// Nats-Time-Stamp, which name the republishing stream's message).
	HeaderLastSequence = "Nats-Last-Sequence"
)

// Relayed reports whether h, the headers of a message as its stream stores
// it (as a consumer delivers it, or a STREAM.MSG.GET returns it; not a
// direct get's answer, which adds headers of its own), carries the
// server's stamp of a relay: the message came from another stream's
// RePublish or from a source, not from a client's publish.
func Relayed(h nats.Header) bool {
	return h.Get(HeaderSource) != "" || h.Get(HeaderLastSequence) != ""
}

// Get asks stream's leader (STREAM.MSG.GET, never a direct get, so that
// the headers are the stored ones) for the message at sequence seq or, with
// next, the first one at or after seq on subject next; with last, the
// newest on subject last instead (seq and next unused). A missing message
// is jetstream.ErrMsgNotFound, a missing stream jetstream.ErrStreamNotFound.
// A ctx without a deadline gets 5 seconds.
func Get(ctx context.Context, nc *nats.Conn, stream string, seq uint64, next, last string) (*jetstream.RawStreamMsg, error) {
	req := struct {
		Seq  uint64 `json:"seq,omitempty"`
		Next string `json:"next_by_subj,omitempty"`
		Last string `json:"last_by_subj,omitempty"`
	}{Seq: seq, Next: next, Last: last}
	if last != "" {
		req.Seq, req.Next = 0, ""
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	resp, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", stream, err)
	}
	var r struct {
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Header  []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, fmt.Errorf("read %s: %w", stream, err)
	}
	switch {
	case r.Error != nil && r.Error.ErrCode == int(jetstream.JSErrCodeStreamNotFound):
		return nil, fmt.Errorf("read %s: %w", stream, jetstream.ErrStreamNotFound)
	case r.Error != nil && r.Error.Code == 404, r.Error == nil && r.Message == nil:
		return nil, jetstream.ErrMsgNotFound
	case r.Error != nil:
		return nil, fmt.Errorf("read %s: %s", stream, r.Error.Description)
	}
	m := &jetstream.RawStreamMsg{Subject: r.Message.Subject, Sequence: r.Message.Seq, Data: r.Message.Data, Time: r.Message.Time}
	if len(r.Message.Header) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(r.Message.Header); err != nil {
			return nil, fmt.Errorf("read %s: headers of %d: %w", stream, m.Sequence, err)
		}
	}
	return m, nil
}

// maxWalk bounds how many of a subject's messages Newest reads when the
// newest one was relayed: a key of the runs bucket keeps 5.
const maxWalk = 64

// Newest returns the newest message on subject in stream that the server
// did not relay (Relayed), and newest, the sequence of the newest message
// on subject whoever wrote it: a compare-and-set of a key must name it to
// replace a relayed record. When no message on subject is a publisher's
// own (or none is among the maxWalk oldest kept before a relayed newest),
// the error is jetstream.ErrMsgNotFound, and newest is 0 only when subject
// holds nothing at all.
func Newest(ctx context.Context, nc *nats.Conn, stream, subject string) (m *jetstream.RawStreamMsg, newest uint64, err error) {
	last, err := Get(ctx, nc, stream, 0, "", subject)
	if err != nil {
		return nil, 0, err
	}
	if !Relayed(last.Header) {
		return last, last.Sequence, nil
	}
	// The subject's messages from its oldest on, keeping the newest a
	// publisher wrote.
	var own *jetstream.RawStreamMsg
	for seq, n := uint64(1), 0; seq < last.Sequence && n < maxWalk; n++ {
		got, err := Get(ctx, nc, stream, seq, subject, "")
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, 0, err
		}
		if got.Sequence >= last.Sequence {
			break
		}
		if !Relayed(got.Header) {
			own = got
		}
		seq = got.Sequence + 1
	}
	if own == nil {
		return nil, last.Sequence, jetstream.ErrMsgNotFound
	}
	return own, last.Sequence, nil
}
