package profile

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"

	"github.com/jetcrew/jetcrew/messages"
)

// maxAgentLine is the longest line of CLI output the parser reads, in bytes;
// a longer line is passed over (its bytes still reach the output events).
const maxAgentLine = 4 << 20

// maxEventText bounds the text of one agent event, in bytes.
const maxEventText = 4 << 10

// Parser reads an agent CLI's structured stdout (JSON lines) as it
// streams: it extracts the final result, the CLI's own view of its MCP
// servers, and one agent event per line. Its callbacks are called from the
// output goroutine.
type Parser struct {
	backend backend
	emit    func(messages.AgentEvent)
	// onMCP is called once with the status the CLI reported for the jetcrew
	// MCP server (Claude Code's init event).
	onMCP func(status string)

	mu      sync.Mutex
	partial []byte
	skip    bool // inside a line longer than maxAgentLine
	result  strings.Builder
	final   string
	summary messages.AgentSummary
	mcpSeen bool
	// onAnswer, once answered, has had the CLI's first answer (answer.go).
	onAnswer func(Answer)
	answered bool
}

// NewParser returns the parser of the named backend's structured output. It
// returns nil (a parser that reads nothing, safe to call) for a backend
// whose output is not parsed. emit receives one agent event per JSON line;
// onMCP, once, the status the CLI reported for the jetcrew MCP server.
func NewParser(name string, emit func(messages.AgentEvent), onMCP func(string)) *Parser {
	b, err := lookupBackend(name)
	if err != nil || !b.structured() {
		return nil
	}
	return &Parser{backend: b, emit: emit, onMCP: onMCP}
}

// Feed takes the next chunk of the CLI's stdout, as it streams.
func (p *Parser) Feed(b []byte) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if !p.skip {
				p.partial = append(p.partial, b...)
				if len(p.partial) > maxAgentLine {
					p.partial, p.skip = nil, true
				}
			}
			return
		}
		if !p.skip {
			p.partial = append(p.partial, b[:i]...)
			p.line(p.partial)
		}
		p.partial, p.skip = p.partial[:0], false
		b = b[i+1:]
	}
}

// Outcome returns the result text and the CLI's summary once output ended.
// The text is the final result the CLI reported, else the text of its
// messages; ("", nil) for a nil Parser.
func (p *Parser) Outcome() (string, *messages.AgentSummary) {
	if p == nil {
		return "", nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.partial) > 0 && !p.skip {
		p.line(p.partial)
		p.partial = nil
	}
	res := p.final
	if res == "" {
		res = p.result.String()
	}
	s := p.summary
	return res, &s
}

func clip(s string) string {
	if len(s) > maxEventText {
		return s[:maxEventText]
	}
	return s
}

// line handles one line of output; p.mu is held.
func (p *Parser) line(l []byte) {
	l = bytes.TrimSpace(l)
	if len(l) == 0 || l[0] != '{' {
		return
	}
	var v map[string]any
	if json.Unmarshal(l, &v) != nil {
		return
	}
	kind, text := p.backend.parse(jstr(v, "type"), v, p)
	if kind == "" {
		kind = "output"
	}
	p.emit(messages.AgentEvent{Kind: kind, Text: clip(text)})
}

// reportMCP passes the status the CLI reported for the jetcrew MCP server
// to onMCP, the first time only; p.mu is held.
func (p *Parser) reportMCP(status string) {
	if !p.mcpSeen && p.onMCP != nil {
		p.mcpSeen = true
		p.onMCP(status)
	}
}

// jstr returns m[k] when it is a string, else "".
func jstr(m map[string]any, k string) string { s, _ := m[k].(string); return s }

// textParts joins the text parts of a message's "content" array.
func textParts(msg map[string]any) string {
	text := ""
	parts, _ := msg["content"].([]any)
	for _, c := range parts {
		if m, ok := c.(map[string]any); ok && jstr(m, "type") == "text" {
			text += jstr(m, "text")
		}
	}
	return text
}
