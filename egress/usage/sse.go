package usage

import "bytes"

// sse splits a server-sent event stream, fed in pieces of any size, into
// its events' data (the WHATWG event stream format: lines ending in "\n"
// or "\r\n"; "data:" lines joined with "\n"; a blank line ends an event;
// lines starting ":" are comments; other fields, "event:" among them, are
// ignored, since every metered format names its event in its data). A
// line ending in a lone "\r" is not recognised: no provider sends one.
//
// Memory is bounded by max: a line longer than max bytes (its "\n" not
// counted) is dropped, and with it the event it belongs to, whatever its
// field; so is an event whose data would grow past max. Neither stops the
// stream, and the outcome does not depend on how the stream was split.
type sse struct {
	max int
	// line holds the start of a line whose end has not arrived.
	line []byte
	// skipLine drops the rest of a line longer than max.
	skipLine bool
	// data is the event's data so far; hasData tells an event with empty
	// data from no event.
	data    []byte
	hasData bool
	// skipEvent drops the event: part of it was too long.
	skipEvent bool
	onEvent   func(data []byte)
}

// keepCap is the buffer capacity kept after a long line or event; a larger
// buffer is released rather than held for the rest of the stream.
const keepCap = 64 << 10

// write feeds p, the stream's next bytes.
func (s *sse) write(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.partial(p)
			return
		}
		chunk := p[:i]
		p = p[i+1:]
		if s.skipLine {
			s.skipLine = false
			continue
		}
		line := chunk
		if len(s.line) == 0 && len(chunk) > s.max {
			// A whole long line in one piece: dropped as if split.
			s.skipEvent = true
			continue
		}
		if len(s.line) > 0 {
			if len(s.line)+len(chunk) > s.max {
				s.dropLine()
				continue
			}
			s.line = append(s.line, chunk...)
			line = s.line
		}
		s.lineDone(line)
		s.line = release(s.line)
	}
}

// partial keeps p, the start of a line, until its end arrives.
func (s *sse) partial(p []byte) {
	if s.skipLine {
		return
	}
	if len(s.line)+len(p) > s.max {
		s.dropLine()
		s.skipLine = true
		return
	}
	s.line = append(s.line, p...)
}

// dropLine drops the line being read, and the event it belongs to.
func (s *sse) dropLine() {
	s.line = release(s.line)
	s.skipEvent = true
}

// end ends the stream: a last line without its newline, and a last event
// without its blank line, still count (the format would drop them; a
// provider's last event is worth reading anyway).
func (s *sse) end() {
	if len(s.line) > 0 && !s.skipLine {
		s.lineDone(s.line)
	}
	s.line, s.skipLine = nil, false
	s.lineDone(nil)
}

// lineDone handles one whole line (its "\n" removed).
func (s *sse) lineDone(line []byte) {
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) == 0 {
		if s.hasData && !s.skipEvent {
			s.onEvent(s.data)
		}
		s.data, s.hasData, s.skipEvent = release(s.data), false, false
		return
	}
	name, value, _ := bytes.Cut(line, []byte(":"))
	if string(name) != "data" || s.skipEvent {
		return
	}
	value = bytes.TrimPrefix(value, []byte(" "))
	size := len(s.data) + len(value)
	if s.hasData {
		size++
	}
	if size > s.max {
		s.data, s.skipEvent = release(s.data), true
		return
	}
	if s.hasData {
		s.data = append(s.data, '\n')
	}
	s.data = append(s.data, value...)
	s.hasData = true
}

// release empties b, keeping its storage unless it grew large.
func release(b []byte) []byte {
	if cap(b) > keepCap {
		return nil
	}
	return b[:0]
}
