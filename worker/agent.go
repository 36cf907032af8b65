package worker

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
)

// maxAgentLine is the longest line of CLI output the parser reads, in bytes;
// a longer line is passed over (its bytes still reach the output events).
const maxAgentLine = 4 << 20

// maxEventText bounds the text of one agent event, in bytes.
const maxEventText = 4 << 10

// agentParser reads an agent CLI's structured stdout (JSON lines) as it
// streams: it extracts the final result, the CLI's own view of its MCP
// servers, and one agent event per line. Its callbacks are called from the
// output goroutine.
type agentParser struct {
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
}

// newAgentParser returns the parser of the named backend's output, or nil
// (a parser that reads nothing) for a backend whose output is not parsed.
func newAgentParser(name string, emit func(messages.AgentEvent), onMCP func(string)) *agentParser {
	b, err := lookupBackend(name)
	if err != nil || !b.structured() {
		return nil
	}
	return &agentParser{backend: b, emit: emit, onMCP: onMCP}
}

// feed takes a chunk of stdout.
func (p *agentParser) feed(b []byte) {
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

// outcome returns the result text and the CLI's summary once output ended.
func (p *agentParser) outcome() (string, *messages.AgentSummary) {
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
func (p *agentParser) line(l []byte) {
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
func (p *agentParser) reportMCP(status string) {
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

// progress records when a run last showed progress: output or coordination
// traffic. It drives the stall watchdog.
type progress struct {
	mu   sync.Mutex
	last time.Time
}

func (p *progress) touch() {
	p.mu.Lock()
	p.last = time.Now()
	p.mu.Unlock()
}

func (p *progress) since() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Since(p.last)
}

// buildReceipt describes what a run uses. It takes no environment values
// and no file contents.
func buildReceipt(p Profile, plan AgentPlan, spec ContainerSpec, timeout time.Duration, prompt string) *messages.Receipt {
	return buildReceiptDigest(p, profileDigest(p), plan, spec, timeout, prompt)
}

// profileDigest returns the hex SHA-256 of p's effective configuration
// (its JSON encoding): a receipt's ProfileDigest.
func profileDigest(p Profile) string {
	effective, _ := json.Marshal(p)
	sum := sha256.Sum256(effective)
	return hex.EncodeToString(sum[:])
}

// profileDigest returns the digest of profile p, configured under name:
// the one New computed, or p's own when the worker has none for name.
func (w *Worker) profileDigest(name string, p Profile) string {
	if d, ok := w.digests[name]; ok {
		return d
	}
	return profileDigest(p)
}

// buildReceiptDigest is buildReceipt with p's digest (profileDigest)
// given: the worker computes it once per profile (Worker.profileDigest).
func buildReceiptDigest(p Profile, digest string, plan AgentPlan, spec ContainerSpec, timeout time.Duration, prompt string) *messages.Receipt {
	rc := &messages.Receipt{
		Profile:       p.Name,
		ProfileDigest: digest,
		Backend:       p.Backend,
		Image:         p.Image,
		User:          p.User,
		Runtime:       p.Runtime,
		Network:       p.Network,
		Egress:        p.Egress,
		Limits:        messages.ReceiptLimits{MemoryBytes: p.MemoryMiB << 20, CPUs: p.CPUs, Pids: p.Pids},
		Tmpfs:         spec.Tmpfs,
		MCPServers:    append([]string{}, plan.MCPServers...),
		Files:         []messages.ReceiptFile{},
		Unsupported:   plan.Unsupported,
	}
	for _, a := range spec.Cmd {
		if prompt != "" && strings.Contains(a, prompt) {
			a = strings.ReplaceAll(a, prompt, "<prompt>")
		}
		rc.Argv = append(rc.Argv, a)
	}
	if timeout > 0 {
		rc.Timeout = timeout.String()
	}
	if p.stallTimeout > 0 {
		rc.StallTimeout = p.stallTimeout.String()
	}
	if p.bridgeRequired() && len(plan.MCPServers) > 0 {
		rc.BridgeDeadline = p.bridgeDeadline.String()
	}
	rc.Mounts = receiptMounts(spec, plan)
	if len(plan.MCPServers) > 0 {
		rc.Files = append(rc.Files, messages.ReceiptFile{Path: coordination.ContainerMCPConfigPath, Mode: fmt.Sprintf("%04o", coordination.MCPConfigMode)})
	}
	for _, f := range plan.Files {
		rc.Files = append(rc.Files, messages.ReceiptFile{Path: f.Path, Mode: fmt.Sprintf("%04o", f.Mode.Perm())})
	}
	names := map[string]bool{}
	for _, kv := range spec.Env {
		k, _, _ := strings.Cut(kv, "=")
		names[k] = true
	}
	for k := range names {
		rc.EnvNames = append(rc.EnvNames, k)
	}
	sort.Strings(rc.EnvNames)
	return rc
}
