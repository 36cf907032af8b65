package egress

import (
	"io"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elazarl/goproxy"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/messages"
)

// recorder counts a session's attempts and publishes their events
// (Config.Publish, Observe, MaxEvents), and knows the attempts in flight.
type recorder struct {
	runID   string
	max     int // Config.MaxEvents
	publish func(messages.EgressEvent)
	observe func(allowed bool)
	log     zerolog.Logger

	mu     sync.Mutex
	counts messages.EgressTotals
	events int
	open   int // attempts in flight, recorded when they end
}

// newRecorder returns the recorder of run runID's session.
func newRecorder(cfg Config, runID string, log zerolog.Logger) *recorder {
	return &recorder{runID: runID, max: cfg.MaxEvents, publish: cfg.Publish, observe: cfg.Observe, log: log}
}

// record counts an attempt and publishes its event, within MaxEvents.
func (r *recorder) record(ev messages.EgressEvent) {
	ev.RunID = r.runID
	ev.DurationMS = time.Since(ev.Time).Milliseconds()
	r.mu.Lock()
	if ev.Allowed {
		r.counts.Allowed++
		r.counts.BytesUp += ev.BytesUp
		r.counts.BytesDown += ev.BytesDown
		if ev.UpstreamFailed() {
			r.counts.UpstreamFailed++
		}
	} else {
		r.counts.Refused++
	}
	publish := r.events < r.max
	if publish {
		r.events++
	} else {
		r.counts.EventsDropped++
	}
	r.mu.Unlock()
	switch { // past MaxEvents, an attempt is only counted, not logged either
	case publish && !ev.Allowed:
		r.log.Info().Str("host", ev.Host).Int("port", ev.Port).Str("reason", ev.Reason).Msg("egress refused")
	case publish && ev.UpstreamFailed():
		r.log.Warn().Str("host", ev.Host).Int("port", ev.Port).Str("reason", ev.Reason).Msg("egress upstream failed")
	}
	if r.observe != nil {
		r.observe(ev.Allowed)
	}
	if publish && r.publish != nil {
		r.publish(ev)
	}
}

// refuse records ev as refused for reason and returns the proxy's answer
// to req: 403 with the reason, as text.
func (r *recorder) refuse(req *http.Request, ev messages.EgressEvent, reason string) *http.Response {
	ev.Reason = reason
	r.record(ev)
	return goproxy.NewResponse(req, "text/plain", http.StatusForbidden, "jetcrew egress: refused: "+reason+"\n")
}

// totals returns the session's counts so far.
func (r *recorder) totals() messages.EgressTotals {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts
}

// begin counts an allowed attempt in flight until end, so that Close waits
// for its event. The attempts in flight are at most the run's connections
// (Config.MaxConns): each carries one at a time.
func (r *recorder) begin() {
	r.mu.Lock()
	r.open++
	r.mu.Unlock()
}

// end ends an attempt counted by begin.
func (r *recorder) end() {
	r.mu.Lock()
	r.open--
	r.mu.Unlock()
}

// waitEnded waits until no attempt is in flight, at most d.
func (r *recorder) waitEnded(d time.Duration) {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		r.mu.Lock()
		open := r.open
		r.mu.Unlock()
		if open == 0 {
			return
		}
	}
}

// attempt is an allowed plain-HTTP or injected request in flight, kept in
// goproxy's UserData.
type attempt struct {
	ev   messages.EgressEvent
	up   *countingReader
	once sync.Once
	// model is the metering of a request to an injected host.
	model *metered
}

// start begins ev, an allowed request req to target: it counts it in
// flight (begin) and counts the bytes of its body sent upstream.
func (r *recorder) start(req *http.Request, ev messages.EgressEvent, target netip.AddrPort) *attempt {
	r.begin()
	ev.Allowed, ev.Addr = true, target.String()
	a := &attempt{ev: ev}
	if req.Body != nil {
		a.up = &countingReader{r: req.Body}
		req.Body = a.up
	}
	return a
}

// finish records a once, with the bytes received and the failure's
// reason (""), and ends it (begin).
func (r *recorder) finish(a *attempt, down int64, reason string) {
	a.once.Do(func() {
		if a.up != nil {
			a.ev.BytesUp = a.up.n.Load()
		}
		a.ev.BytesDown, a.ev.Reason = down, reason
		r.record(a.ev)
		r.end()
	})
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.ReadCloser
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }

// closeHook calls close once the body is closed.
type closeHook struct {
	*countingReader
	close func()
}

func (c *closeHook) Close() error {
	err := c.countingReader.Close()
	c.close()
	return err
}
