package usage

import (
	"bytes"
	"io"
	"mime"
	"sync"

	"github.com/jetcrew/jetcrew/messages"
)

// Result is what a response's body said about usage (Wrap).
type Result struct {
	// Model is the model the response named (Anthropic's and OpenAI's
	// "model", Gemini's "modelVersion"), else the request's
	// (Request.Model).
	Model string
	// Tokens are the usage read, by kind; zero unless Known.
	Tokens messages.Tokens
	// WebSearches counts the web searches the response reported (Anthropic's
	// usage.server_tool_use.web_search_requests; the web_search_call items
	// of an OpenAI Responses output, each counted once); zero unless Known.
	WebSearches int64
	// Tier names the processing tier the response says it was served at,
	// when it is dearer than the provider's standard one: "service_tier
	// priority" (OpenAI's service_tier "priority", "scale", "ultrafast", or
	// Anthropic's usage.service_tier "priority"), "speed fast" (Anthropic's
	// usage.speed). "" for the standard tier and the cheaper ones ("auto",
	// "default", "flex", "standard", "batch"), and unless Known.
	Tier string
	// Known is true when the response carried a usage object the package
	// read: false for an error status (>= 400), an unknown format, a body
	// that is not the format's, an OpenAI Chat stream without its usage
	// chunk, a JSON body past the bound, or a body that ended before any
	// usage arrived.
	Known bool
	// Stream is true for a streamed response: a text/event-stream body, or
	// a Gemini streamGenerateContent answered with a JSON array (without
	// alt=sse).
	Stream bool
}

// DefaultMaxJSON is the bound Wrap uses when its maxJSON is not positive:
// 1 MiB.
const DefaultMaxJSON = 1 << 20

// Wrap returns a body that gives its reader every byte of body, unchanged
// and at once (each Read returns what the underlying Read returned: a
// server-sent event reaches the agent as soon as it arrived), while it
// reads the usage of the response to a request of format (Detect's) and
// req (ReadRequest's), whose HTTP status and Content-Type header are
// status and contentType.
//
// A text/event-stream body is read event by event as it passes; any other
// body is kept, up to maxJSON bytes, and read as JSON when it ends (past
// maxJSON it passes on but its usage is unknown). maxJSON also bounds the
// memory of a stream: a line or an event longer than maxJSON is skipped
// (OpenAI Responses' response.completed repeats the whole output, so it
// must be large enough for the largest response); a stream holds at most
// about twice maxJSON (a line and an event's data). A maxJSON <= 0 is
// DefaultMaxJSON. A response with status >= 400, of an unknown format, is
// passed on unread, with Known false.
//
// done, if not nil, is called exactly once, with the Result, when the body
// first reaches EOF, returns a read error or is closed; a body ended early
// counts the usage read so far (see the package doc). done is called from
// the goroutine that read or closed; it must not call the body's Close.
// Close may be called concurrently with Read (as net/http does): it closes
// body, which ends a Read in progress.
func Wrap(format string, req Request, status int, contentType string, body io.ReadCloser, maxJSON int64, done func(Result)) io.ReadCloser {
	if maxJSON <= 0 {
		maxJSON = DefaultMaxJSON
	}
	b := &wrapped{rc: body, done: done, max: maxJSON}
	b.res.Model = req.Model
	mediaType, _, _ := mime.ParseMediaType(contentType)
	isSSE := mediaType == "text/event-stream"
	b.res.Stream = isSSE || (format == messages.FormatGemini && req.Stream && status < 400)
	rd, ok := readers[format]
	switch {
	case !ok || status >= 400:
		// passed on unread
	case isSSE:
		b.sse = &sse{max: int(min(maxJSON, int64(^uint(0)>>1))), onEvent: func(data []byte) { rd.event(&b.t, data) }}
	default:
		b.json, b.readBody = &bytes.Buffer{}, rd.body
	}
	return b
}

// wrapped is Wrap's body.
type wrapped struct {
	rc   io.ReadCloser
	done func(Result)
	max  int64

	// mu guards what follows: Read and Close may run at once.
	mu sync.Mutex
	// ended is set once done has been called for.
	ended bool
	res   Result
	t     tally
	// sse reads a stream; json and readBody keep and read a JSON body
	// (json nil once past max). Both nil: nothing is read.
	sse      *sse
	json     *bytes.Buffer
	readBody func(*tally, []byte)
}

// Read implements io.Reader: it returns what body's Read returned, after
// reading usage from it.
func (b *wrapped) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.mu.Lock()
	var res *Result
	if !b.ended {
		if n > 0 {
			b.feed(p[:n])
		}
		if err != nil {
			res = b.end(err == io.EOF)
		}
	}
	b.mu.Unlock()
	if res != nil && b.done != nil {
		b.done(*res)
	}
	return n, err
}

// Close closes body and ends the reading, if no Read ended it before.
func (b *wrapped) Close() error {
	err := b.rc.Close()
	b.mu.Lock()
	var res *Result
	if !b.ended {
		res = b.end(false)
	}
	b.mu.Unlock()
	if res != nil && b.done != nil {
		b.done(*res)
	}
	return err
}

// feed reads p, the body's next bytes. Callers hold mu.
func (b *wrapped) feed(p []byte) {
	switch {
	case b.sse != nil:
		b.sse.write(p)
	case b.json != nil:
		if int64(b.json.Len())+int64(len(p)) > b.max {
			b.json = nil
			return
		}
		b.json.Write(p)
	}
}

// end marks the reading ended and returns the Result; eof is true when the
// body reached its end. Callers hold mu.
func (b *wrapped) end(eof bool) *Result {
	b.ended = true
	switch {
	case b.sse != nil:
		if eof {
			b.sse.end()
		}
		b.sse = nil
	case b.json != nil:
		// A body closed early is only read if it is whole JSON anyway:
		// a reader may stop at the value's end before EOF.
		b.readBody(&b.t, b.json.Bytes())
		b.json = nil
	}
	res := b.res
	if b.t.model != "" {
		res.Model = b.t.model
	}
	if b.t.known {
		res.Tokens, res.WebSearches, res.Tier, res.Known = b.t.final(), b.t.webSearches, b.t.tier, true
	}
	return &res
}
