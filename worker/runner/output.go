package runner

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/runstate"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// outputFlushInterval is how long output may wait in the buffer before it is
// published, so that a slow writer's output still streams.
const outputFlushInterval = 50 * time.Millisecond

// outputPublisher turns a container's output into EventOutput messages. It
// coalesces consecutive writes to the same stream into chunks of at most
// messages.MaxOutputChunk bytes, never merging across a change of stream
// (a write to the other stream first closes the pending chunk), and stamps
// each chunk with messages.HeaderSeq as it closes it, so interleaved stdout
// and stderr keep the order the runtime handed them over in. Messages are
// published asynchronously, in order, on one connection; close waits for
// every ack. (A masker's held-back tail of one stream, the start of a
// possible secret, is written when that stream's next bytes or close
// decide it: only then does it take its place.)
type outputPublisher struct {
	js      jetstream.JetStream
	subject string
	runID   string
	seq     string // the request's stream sequence, for message ids
	attempt string

	mu      sync.Mutex
	stream  string
	buf     []byte
	offsets map[string]int64
	total   int64
	// chunks counts the chunks made so far, of both streams: each one's
	// messages.HeaderSeq, in the order their bytes were written.
	chunks uint64
	// errTail keeps the last bytes written to stderr, for failure reasons.
	errTail []byte
	// futures are the publishes not yet known acknowledged, oldest first:
	// at most outputWindow (waitWindowLocked).
	futures []jetstream.PubAckFuture
	err     error
	// budget is the most bytes published (Profile.MaxOutputBytes; 0:
	// unlimited); accepted counts those taken, dropped those past it.
	budget   int64
	accepted int64
	dropped  int64
	// mask masks the run's secrets in its output (nil: none); onStdout,
	// when set, is fed stdout after masking (the agent CLI's parser).
	mask     stage.Masker
	onStdout func([]byte)
	// skip counts, per stream, the bytes (masked) of an adopted run's
	// output the worker it was adopted from already published: the
	// runtime hands the adopter the output from its start (resume).
	// onSkipped, when set, is fed the skipped stdout (the agent CLI's
	// parser, rebuilding its state without publishing again).
	skip      map[string]int64
	onSkipped func([]byte)
	// left is set when the run is left running for a successor (close
	// then publishes nothing the masker holds back).
	left atomic.Bool
	// held queues messages instead of publishing them until release, so
	// that no output event precedes the run's started event.
	held    bool
	pending []*nats.Msg
	// gate, when set, is closed once the started event is stored: close
	// waits for it before publishing held messages (publishStarted).
	gate <-chan struct{}

	stop chan struct{}
	done chan struct{}
	// flusherOn is set once the flusher runs (startFlusherLocked); closed
	// once close began.
	flusherOn, closed bool
}

func newOutputPublisher(js jetstream.JetStream, runID string, seq uint64, attempt int) *outputPublisher {
	o := &outputPublisher{
		seq:     strconv.FormatUint(seq, 10),
		js:      js,
		subject: messages.SubjectEvents(runID, messages.EventOutput),
		runID:   runID,
		attempt: strconv.Itoa(attempt),
		offsets: map[string]int64{},
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		held:    true,
	}
	return o
}

// startFlusherLocked starts the flusher on the first output: a run that
// writes nothing costs no goroutine and no ticker. Not after close.
func (o *outputPublisher) startFlusherLocked() {
	if o.flusherOn || o.closed {
		return
	}
	o.flusherOn = true
	go o.flusher()
}

// append buffers p, already masked, for publishing.
func (o *outputPublisher) append(stream string, p []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.startFlusherLocked()
	if stream == messages.StreamStderr {
		o.errTail = append(o.errTail, p[max(0, len(p)-errTailBytes):]...)
		if len(o.errTail) > errTailBytes {
			o.errTail = append(o.errTail[:0], o.errTail[len(o.errTail)-errTailBytes:]...)
		}
	}
	p = p[:o.admitLocked(len(p))]
	for len(p) > 0 {
		if o.stream != stream && len(o.buf) > 0 {
			o.flushLocked()
		}
		o.stream = stream
		n := min(len(p), messages.MaxOutputChunk-len(o.buf))
		o.buf = append(o.buf, p[:n]...)
		p = p[n:]
		if len(o.buf) >= messages.MaxOutputChunk {
			o.flushLocked()
		}
	}
}

func (o *outputPublisher) flusher() {
	defer close(o.done)
	t := time.NewTicker(outputFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-o.stop:
			return
		case <-t.C:
			o.mu.Lock()
			o.flushLocked()
			o.mu.Unlock()
		}
	}
}

func (o *outputPublisher) flushLocked() {
	if len(o.buf) == 0 {
		return
	}
	msg := nats.NewMsg(o.subject)
	msg.Data = o.buf
	msg.Header.Set(messages.HeaderRunID, o.runID)
	msg.Header.Set(messages.HeaderStream, o.stream)
	msg.Header.Set(messages.HeaderOffset, strconv.FormatInt(o.offsets[o.stream], 10))
	o.chunks++
	msg.Header.Set(messages.HeaderSeq, strconv.FormatUint(o.chunks, 10))
	msg.Header.Set(messages.HeaderAttempt, o.attempt)
	// Deduplicates a chunk re-published after its first ack was lost.
	// The request's sequence keeps a replay's output apart from the
	// original's.
	msg.Header.Set(jetstream.MsgIDHeader, "out-"+o.runID+"-"+o.seq+"-"+o.attempt+"-"+o.stream+"-"+msg.Header.Get(messages.HeaderOffset))
	o.offsets[o.stream] += int64(len(o.buf))
	o.total += int64(len(o.buf))
	msg.Header.Set(messages.HeaderOutputEnds, strconv.FormatInt(o.offsets[messages.StreamStdout], 10)+","+strconv.FormatInt(o.offsets[messages.StreamStderr], 10))
	o.buf = nil // the message owns the old slice now
	if o.held {
		o.pending = append(o.pending, msg)
		return
	}
	o.publishLocked(msg)
}

// release publishes the messages held so far and every later one at once.
func (o *outputPublisher) release() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.held = false
	for _, m := range o.pending {
		o.publishLocked(m)
	}
	o.pending = nil
}

func (o *outputPublisher) publishLocked(msg *nats.Msg) {
	o.waitWindowLocked()
	f, err := o.js.PublishMsgAsync(msg)
	if err != nil {
		// The async window is full: fall back to a synchronous publish so no
		// output is dropped.
		err = runstate.RetryOp(context.Background(), func(ctx context.Context) error { _, err := o.js.PublishMsg(ctx, msg); return err })
		if err != nil && o.err == nil {
			o.err = err
		}
		return
	}
	o.futures = append(o.futures, f)
}

// errTailBytes is how much of stderr's end is kept for failure reasons.
const errTailBytes = 512

// lastErrLine returns the last non-empty line written to stderr, at most
// 200 bytes, with invalid UTF-8 replaced.
func (o *outputPublisher) lastErrLine() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	lines := strings.Split(strings.ToValidUTF8(string(o.errTail), "?"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			if len(l) > 200 {
				l = l[:200]
			}
			return l
		}
	}
	return ""
}

// close flushes what is buffered and waits until the server acknowledged
// every output message or ctx ends. It returns the total bytes published and
// the first publish error.
func (o *outputPublisher) close(ctx context.Context) (int64, error) {
	o.mu.Lock()
	o.closed = true
	flusherOn := o.flusherOn
	o.mu.Unlock()
	close(o.stop)
	if flusherOn {
		<-o.done
	}
	o.flushMasked()
	o.mu.Lock()
	o.flushLocked()
	wait := o.held && len(o.pending) > 0 && o.gate != nil
	o.mu.Unlock()
	if wait {
		// Held output waits for the started event.
		select {
		case <-o.gate:
		case <-ctx.Done():
		}
	}
	o.release()
	o.mu.Lock()
	futures, total, err := o.futures, o.total, o.err
	o.futures = nil
	o.mu.Unlock()
	// Chunks whose publish failed (a server lost mid-flight, say) are
	// published again, in their order, until acknowledged; Nats-Msg-Id
	// deduplicates those that had in fact been stored.
	for _, f := range futures {
		if e := o.settle(ctx, f); e != nil {
			if ctx.Err() != nil {
				return total, ctx.Err()
			}
			if err == nil {
				err = e
			}
		}
	}
	return total, err
}

// write is the OutputFunc handed to the runtime: it masks p, feeds stdout
// to onStdout and buffers the result for publishing. The runtime calls it
// from one goroutine.
func (o *outputPublisher) write(stream string, p []byte) {
	if o.mask != nil {
		o.mu.Lock()
		p = o.mask.Stream(stream, p)
		o.mu.Unlock()
	}
	o.emit(stream, p)
}

func (o *outputPublisher) emit(stream string, p []byte) {
	if n := min(int64(len(p)), o.skip[stream]); n > 0 {
		// Published by the worker the run was adopted from.
		o.skip[stream] -= n
		if stream == messages.StreamStdout && o.onSkipped != nil {
			o.onSkipped(p[:n])
		}
		p = p[n:]
	}
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
	if o.mask == nil || o.left.Load() {
		// A run left running is not at its end: what the masker holds
		// back may yet become a secret (the adopter masks it).
		return
	}
	for _, stream := range []string{messages.StreamStdout, messages.StreamStderr} {
		o.mu.Lock()
		rest := o.mask.Flush(stream)
		o.mu.Unlock()
		o.emit(stream, rest)
	}
}

// maskErr returns err with the secrets mask masks in its text; err itself
// when there is nothing to mask (mask nil masks nothing).
func maskErr(mask stage.Masker, err error) error {
	if mask == nil || err == nil {
		return err
	}
	if msg := mask.String(err.Error()); msg != err.Error() {
		return errors.New(msg)
	}
	return err
}

// resume makes o continue an adopted run's output where the worker it was
// adopted from stopped publishing: after its last stored chunk, the
// chunk's messages.HeaderSeq seq and each stream's end there (ends:
// stdout, stderr; messages.HeaderOutputEnds). The bytes before the ends
// are skipped as the runtime hands them again, and o publishes at once
// (the run's started event is long stored).
func (o *outputPublisher) resume(seq uint64, ends [2]int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.chunks = seq
	o.offsets[messages.StreamStdout], o.offsets[messages.StreamStderr] = ends[0], ends[1]
	o.total = ends[0] + ends[1]
	o.accepted = o.total
	o.skip = map[string]int64{messages.StreamStdout: ends[0], messages.StreamStderr: ends[1]}
	o.held = false
}
