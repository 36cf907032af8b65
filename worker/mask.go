package worker

import (
	"bytes"
	"errors"
	"slices"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
)

// SecretMask replaces every secret value in what a run shows to anyone.
const SecretMask = "***"

// minSecretBytes is the shortest value masked: a shorter one (a 1, a yes)
// would turn ordinary output into noise and is no secret worth the name.
const minSecretBytes = 4

// masker replaces the values of a run's secrets (its profile's
// env_from_host variables, as set on the worker) with SecretMask: in its
// output events, the agent events and result parsed from them, its reason
// (and so its dead letter's headers and the worker's log). Output is masked
// as a stream: the end of a chunk that could begin a secret is held back
// until the next chunk of the same stream (or close) decides, so a value
// split across chunks is masked too. Masking matches bytes: a secret that is
// encoded (base64, hex, JSON-escaped, reversed, one character per line)
// passes through, as in GitHub Actions. A nil *masker masks nothing.
// Not safe for concurrent use: the output publisher calls it under its lock.
type masker struct {
	secrets [][]byte // longest first, so a secret containing another wins
	carry   map[string][]byte
}

// newMasker returns a masker for the values of names in prof.EnvFromHost
// that lookup finds, or nil when there are none worth masking.
func newMasker(prof Profile, lookup func(string) (string, bool)) *masker {
	var secrets [][]byte
	for _, name := range prof.EnvFromHost {
		if v, ok := lookup(name); ok && len(v) >= minSecretBytes {
			secrets = append(secrets, []byte(v))
		}
	}
	if len(secrets) == 0 {
		return nil
	}
	slices.SortFunc(secrets, func(a, b []byte) int { return len(b) - len(a) })
	return &masker{secrets: secrets, carry: map[string][]byte{}}
}

// String returns s with every secret masked.
func (m *masker) String(s string) string {
	if m == nil {
		return s
	}
	for _, v := range m.secrets {
		s = strings.ReplaceAll(s, string(v), SecretMask)
	}
	return s
}

// stream masks the next chunk p of output stream name and returns what may
// be published now; a tail that could start a secret is kept for later.
func (m *masker) stream(name string, p []byte) []byte {
	if m == nil {
		return p
	}
	buf := append(m.carry[name], p...)
	for _, v := range m.secrets {
		if bytes.Contains(buf, v) {
			buf = bytes.ReplaceAll(buf, v, []byte(SecretMask))
		}
	}
	k := m.heldTail(buf)
	m.carry[name] = append([]byte(nil), buf[len(buf)-k:]...)
	return buf[:len(buf)-k]
}

// heldTail returns the length of the longest end of buf that is a proper
// beginning of a secret.
func (m *masker) heldTail(buf []byte) int {
	for k := min(len(buf), len(m.secrets[0])-1); k > 0; k-- {
		tail := buf[len(buf)-k:]
		for _, v := range m.secrets {
			if len(v) > k && bytes.HasPrefix(v, tail) {
				return k
			}
		}
	}
	return 0
}

// flush returns what stream name still holds back: at the end of the
// output it can no longer become a secret.
func (m *masker) flush(name string) []byte {
	if m == nil {
		return nil
	}
	rest := m.carry[name]
	delete(m.carry, name)
	return rest
}

// write is the OutputFunc handed to the runtime: it masks p, feeds stdout
// to onStdout and buffers the result for publishing. The runtime calls it
// from one goroutine.
func (o *outputPublisher) write(stream string, p []byte) {
	o.mu.Lock()
	p = o.mask.stream(stream, p)
	o.mu.Unlock()
	o.emit(stream, p)
}

func (o *outputPublisher) emit(stream string, p []byte) {
	if len(p) == 0 {
		return
	}
	if stream == messages.StreamStdout && o.onStdout != nil {
		o.onStdout(p)
	}
	o.append(stream, p)
}

// flushMasked publishes what the masker still holds back, at the end of
// the output.
func (o *outputPublisher) flushMasked() {
	for _, stream := range []string{messages.StreamStdout, messages.StreamStderr} {
		o.mu.Lock()
		rest := o.mask.flush(stream)
		o.mu.Unlock()
		o.emit(stream, rest)
	}
}

// maskErr returns err with the run's secrets masked in its text; err itself
// when there is nothing to mask.
func (r *run) maskErr(err error) error {
	if r.mask == nil || err == nil {
		return err
	}
	if msg := r.mask.String(err.Error()); msg != err.Error() {
		return errors.New(msg)
	}
	return err
}
