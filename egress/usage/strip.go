package usage

import (
	"bytes"
	"encoding/json"
	"io"
	"sync"
)

// maxHeldEvent is the longest event StripUsage holds to look at: a usage
// chunk is a few hundred bytes; a longer event passes on unexamined.
const maxHeldEvent = 64 << 10

// StripUsage returns body, a Chat Completions stream whose request the
// proxy made ask for usage (IncludeUsage), without the chunk that adds:
// the event whose data is a chunk with an empty "choices" and a "usage"
// object (OpenAI's documented usage chunk, sent before [DONE]). Every
// other byte reaches the reader unchanged and in order, so the client gets
// the stream it asked for. A usage that arrives on a chunk with choices is
// left in it (taking it out would change the chunk).
//
// Each event is held until its blank line arrives (a provider sends an
// event whole, so nothing waits in practice); an event longer than 64 KiB
// is passed on as it comes, unexamined. Close closes body; it may be
// called while a Read is in progress (as net/http does).
func StripUsage(body io.ReadCloser) io.ReadCloser {
	return &stripper{rc: body, buf: make([]byte, 16<<10)}
}

// stripper is StripUsage's body.
type stripper struct {
	rc  io.ReadCloser
	buf []byte

	mu sync.Mutex // Read against Close
	// out holds bytes ready for the reader; event the current event's
	// bytes so far (up to its last whole line); line a line not yet
	// ended; pass that the current event is too long to hold, passText
	// that the line being passed has text (it is not the blank line that
	// ends the event).
	out, event, line []byte
	data             [][]byte // the current event's data fields
	pass, passText   bool
	err              error // the body's, given once out is drained
}

// Read implements io.Reader.
func (s *stripper) Read(p []byte) (int, error) {
	for {
		s.mu.Lock()
		if len(s.out) > 0 {
			n := copy(p, s.out)
			s.out = s.out[n:]
			s.mu.Unlock()
			return n, nil
		}
		if s.err != nil {
			err := s.err
			s.mu.Unlock()
			return 0, err
		}
		s.mu.Unlock()
		n, err := s.rc.Read(s.buf)
		s.mu.Lock()
		s.feed(s.buf[:n])
		if err != nil {
			s.end()
			s.err = err
		}
		s.mu.Unlock()
	}
}

// Close closes the body.
func (s *stripper) Close() error { return s.rc.Close() }

// feed splits p into lines and events. Callers hold mu.
func (s *stripper) feed(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.partial(p)
			return
		}
		s.partial(p[:i+1])
		p = p[i+1:]
		s.lineDone()
	}
}

// partial adds p, part of a line, to the line being read, or passes it on
// when the event is too long to hold.
func (s *stripper) partial(p []byte) {
	if !s.pass && len(s.event)+len(s.line)+len(p) > maxHeldEvent {
		s.out = append(append(s.out, s.event...), s.line...)
		s.passText = len(bytes.TrimRight(s.line, "\r\n")) > 0
		s.event, s.line, s.data, s.pass = nil, nil, nil, true
	}
	if s.pass {
		s.out = append(s.out, p...)
		s.passText = s.passText || len(bytes.TrimRight(p, "\r\n")) > 0
		return
	}
	s.line = append(s.line, p...)
}

// lineDone handles the line just ended (its "\n" read): a passed event
// ends at a blank line; a held one is looked at when its blank line comes.
func (s *stripper) lineDone() {
	if s.pass {
		if !s.passText {
			s.pass = false
		}
		s.passText = false
		return
	}
	line := bytes.TrimRight(s.line, "\r\n")
	s.event = append(s.event, s.line...)
	s.line = nil
	if len(line) > 0 {
		if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			s.data = append(s.data, bytes.TrimPrefix(v, []byte(" ")))
		}
		return
	}
	if !isUsageChunk(bytes.Join(s.data, []byte("\n"))) {
		s.out = append(s.out, s.event...)
	}
	s.event, s.data = nil, nil
}

// end passes on what is held when the body ends: an event without its
// blank line is looked at as a whole one. Callers hold mu.
func (s *stripper) end() {
	if s.pass {
		s.pass = false
		return
	}
	if len(s.line) > 0 {
		line := bytes.TrimRight(s.line, "\r\n")
		if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			s.data = append(s.data, bytes.TrimPrefix(v, []byte(" ")))
		}
		s.event = append(s.event, s.line...)
		s.line = nil
	}
	if len(s.event) > 0 && !isUsageChunk(bytes.Join(s.data, []byte("\n"))) {
		s.out = append(s.out, s.event...)
	}
	s.event, s.data = nil, nil
}

// isUsageChunk reports whether data is a chat completion chunk with no
// choices and a usage object: the chunk include_usage adds.
func isUsageChunk(data []byte) bool {
	if !mentions(data, `"usage"`) {
		return false
	}
	var c struct {
		Choices *[]json.RawMessage `json:"choices"`
		Usage   *chatUsage         `json:"usage"`
	}
	return json.Unmarshal(data, &c) == nil && c.Usage != nil && c.Choices != nil && len(*c.Choices) == 0
}
