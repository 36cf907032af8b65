package runstate

import (
	"encoding/json"
	"strconv"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DeadLetterMsg builds the dead letter of the request data (its body, byte
// for byte) at stream sequence seq, whose run ended as st: subject
// jetcrew.failed.<pool>.<run_id>, headers saying why, and a Nats-Msg-Id that
// makes it one dead letter per request message, however often a crash makes
// it published.
func DeadLetterMsg(data []byte, st messages.RunState, seq uint64, workerID string) *nats.Msg {
	pool := st.Pool
	if pool == "" {
		pool = messages.DefaultPool
	}
	m := nats.NewMsg(messages.SubjectFailed(pool, st.ID))
	m.Data = data
	m.Header.Set(messages.HeaderRunID, st.ID)
	m.Header.Set(messages.HeaderError, OneLine(st.Reason))
	m.Header.Set(messages.HeaderState, string(st.State))
	m.Header.Set(messages.HeaderAttempts, strconv.Itoa(st.Attempts))
	m.Header.Set(messages.HeaderWorker, workerID)
	if st.ExitCode != nil {
		m.Header.Set(messages.HeaderExitCode, strconv.Itoa(*st.ExitCode))
	}
	if st.Receipt != nil {
		if b, err := json.Marshal(st.Receipt); err == nil {
			m.Header.Set(messages.HeaderReceipt, string(b))
		}
	}
	m.Header.Set(jetstream.MsgIDHeader, DeadLetterMsgID(st.ID, seq))
	return m
}

// OneLine returns s with its line breaks made spaces, at most 1,024 bytes:
// fit for a header (a dead letter's Jetcrew-Error).
func OneLine(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '\r' || c == '\n' {
			b[i] = ' '
		}
	}
	if len(b) > 1024 {
		b = b[:1024]
	}
	return string(b)
}

// DeadLetterMsgID is the Nats-Msg-Id of a run's dead letter for the request
// at stream sequence seq: one dead letter per request message.
func DeadLetterMsgID(runID string, seq uint64) string {
	return "dl-" + runID + "-" + strconv.FormatUint(seq, 10)
}

// CopySignature copies a request's signature headers, if any, from src to
// dst (a dead letter), so a replay of the request is still signed: the
// profile's (messages.HeaderSigner, messages.HeaderSignature) and the
// group's (messages.HeaderGroupSignature).
func CopySignature(dst, src nats.Header) {
	for _, k := range []string{messages.HeaderSigner, messages.HeaderSignature, messages.HeaderGroupSignature} {
		if v := src.Get(k); v != "" {
			dst.Set(k, v)
		}
	}
}
