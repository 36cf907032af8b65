package bridge

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// NoBatchesSince is the first MCP protocol revision without JSON-RPC
// batching: 2025-06-18 removed it; 2025-03-26 requires a server to receive
// batches.
const NoBatchesSince = "2025-06-18"

// JSON-RPC error codes Batches answers with.
const (
	codeParseError     = -32700
	codeInvalidRequest = -32600
)

// Batches sits between an MCP client's stdio stream and the SDK's
// IOTransport and takes JSON-RPC batches off the SDK's hands (its own batch
// handling leaves a batch holding a notification unanswered and ends the
// session on two notifications or, from 2025-06-18 on, on any batch):
//   - under a revision that has batches (before NoBatchesSince), each
//     message of a batch is handed to the SDK on its own, and the responses
//     to the batch's requests are written back as one array once all are in
//     (nothing at all for a batch of notifications), as JSON-RPC 2.0 says;
//   - from NoBatchesSince on, a batch is answered with one JSON-RPC error
//     (Invalid Request, id null) and nothing of it reaches the SDK;
//   - an empty batch, a batch with a repeated request id, and a member that
//     is not a JSON object are answered with JSON-RPC errors.
//
// Either way the session goes on. The revision is the one the server's
// initialize response negotiated; before it, batches are read as 2025-03-26
// reads them.
type Batches struct {
	outMu   sync.Mutex
	out     io.Writer
	stateMu sync.Mutex
	version string
	pending map[string]*pendingBatch // request id (canonical JSON) → its batch
}

type pendingBatch struct {
	waiting   int
	responses []json.RawMessage
}

// NewBatches returns the filter writing to out (the real stdout). Give the
// SDK transport Reader(in) and the Batches itself as its writer.
func NewBatches(out io.Writer) *Batches {
	return &Batches{out: out, pending: map[string]*pendingBatch{}}
}

// Reader returns what the SDK reads: in's newline-delimited frames, each
// batch split into its messages. A frame longer than maxFrame bytes ends the
// stream with an error (the session ends, as the SDK's own limit does). It
// reads in on the caller's goroutine (the SDK's reading goroutine), with no
// goroutine or pipe of its own: a frame reaches the SDK without a hand-off
// between goroutines. Closing it does nothing; in belongs to the caller.
func (b *Batches) Reader(in io.Reader, maxFrame int) io.ReadCloser {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), maxFrame)
	return &frameReader{b: b, sc: sc}
}

// frameReader is the io.ReadCloser Batches.Reader returns.
type frameReader struct {
	b       *Batches
	sc      *bufio.Scanner
	buf     []byte // the current line and its newline, reused line after line
	pending []byte // what is left of buf to read
	err     error  // what ended in: io.EOF or the scanner's error
}

// Read copies the current line's rest into p, scanning the next line of in
// when none is left; it returns io.EOF at the end of in, or the error that
// ended in.
func (r *frameReader) Read(p []byte) (int, error) {
	for len(r.pending) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		if !r.sc.Scan() {
			r.err = r.sc.Err()
			if r.err == nil {
				r.err = io.EOF
			}
			continue
		}
		line := bytes.TrimSpace(r.sc.Bytes())
		if len(line) > 0 && line[0] == '[' {
			line = r.b.unbatch(line)
		}
		if len(line) > 0 {
			// The scanner reuses its buffer: keep a copy until it is read.
			r.buf = append(append(r.buf[:0], line...), '\n')
			r.pending = r.buf
		}
	}
	n := copy(p, r.pending)
	r.pending = r.pending[n:]
	return n, nil
}

// Close does nothing: the stream under the reader is the caller's to close.
func (r *frameReader) Close() error { return nil }

// unbatch handles one batch frame and returns what the SDK should read: its
// messages, one a line, or nothing.
func (b *Batches) unbatch(frame []byte) []byte {
	var members []json.RawMessage
	if err := json.Unmarshal(frame, &members); err != nil {
		b.writeFrame(errorResponse(nil, codeParseError, "parse error: "+err.Error()))
		return nil
	}
	b.stateMu.Lock()
	version := b.version
	b.stateMu.Unlock()
	switch {
	case version >= NoBatchesSince:
		b.writeFrame(errorResponse(nil, codeInvalidRequest, fmt.Sprintf("JSON-RPC batches are not part of MCP %s (negotiated); send each message on its own line", version)))
		return nil
	case len(members) == 0:
		b.writeFrame(errorResponse(nil, codeInvalidRequest, "empty batch"))
		return nil
	}
	batch := &pendingBatch{}
	var pass [][]byte
	ids := map[string]bool{}
	for _, m := range members {
		var head struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if _, err := jsonrpc.DecodeMessage(m); err != nil || json.Unmarshal(m, &head) != nil {
			// The SDK would end the session on it: answer it here.
			batch.responses = append(batch.responses, errorResponse(nil, codeInvalidRequest, "batch member is not a JSON-RPC message"))
			continue
		}
		if head.Method != "" && len(head.ID) > 0 && string(head.ID) != "null" {
			id := canonicalID(head.ID)
			if ids[id] {
				b.writeFrame(errorResponse(nil, codeInvalidRequest, "batch repeats request id "+id))
				return nil
			}
			ids[id] = true
		}
		pass = append(pass, m)
	}
	b.stateMu.Lock()
	for id := range ids {
		if _, taken := b.pending[id]; taken {
			b.stateMu.Unlock()
			b.writeFrame(errorResponse(nil, codeInvalidRequest, "batch repeats request id "+id+" still in progress"))
			return nil
		}
	}
	batch.waiting = len(ids)
	for id := range ids {
		b.pending[id] = batch
	}
	b.stateMu.Unlock()
	if len(ids) == 0 && len(batch.responses) > 0 {
		b.writeBatch(batch.responses) // nothing will answer: send the errors now
	}
	return bytes.Join(pass, []byte("\n"))
}

// Write takes one frame the SDK writes. A response to a request of a pending
// batch is held until the batch is complete; an initialize response records
// the negotiated revision; everything else goes out as it is.
func (b *Batches) Write(p []byte) (int, error) {
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Result *struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"result"`
	}
	if json.Unmarshal(p, &msg) == nil && msg.Method == "" && len(msg.ID) > 0 {
		if msg.Result != nil && msg.Result.ProtocolVersion != "" {
			b.stateMu.Lock()
			b.version = msg.Result.ProtocolVersion
			b.stateMu.Unlock()
		}
		id := canonicalID(msg.ID)
		b.stateMu.Lock()
		batch, ok := b.pending[id]
		if ok {
			delete(b.pending, id)
			batch.responses = append(batch.responses, json.RawMessage(bytes.TrimSpace(p)))
			batch.waiting--
		}
		b.stateMu.Unlock()
		if ok {
			if batch.waiting == 0 {
				b.writeBatch(batch.responses)
			}
			return len(p), nil
		}
	}
	b.outMu.Lock()
	defer b.outMu.Unlock()
	return b.out.Write(p)
}

func (b *Batches) writeBatch(responses []json.RawMessage) {
	data, err := json.Marshal(responses)
	if err == nil {
		b.writeFrame(data)
	}
}

// writeFrame writes one frame and its newline. A write error is the SDK's
// to meet on its next write.
func (b *Batches) writeFrame(frame []byte) {
	b.outMu.Lock()
	defer b.outMu.Unlock()
	_, _ = b.out.Write(append(frame, '\n'))
}

// errorResponse encodes a JSON-RPC error response; a nil id is null.
func errorResponse(id json.RawMessage, code int, message string) json.RawMessage {
	if id == nil {
		id = json.RawMessage("null")
	}
	data, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{code, message}})
	return data
}

// canonicalID returns a JSON-RPC id in one spelling (1, 1.0 and 1e0 are one
// id), so a response matches its request.
func canonicalID(raw json.RawMessage) string {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	b, _ := json.Marshal(v)
	return string(b)
}
