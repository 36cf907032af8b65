package coordination

import (
	"context"
	"crypto/rand"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/messages"
)

// core is what every feature of a session shares: the run it acts as, the
// host's NATS handles and configuration, the session's lifetime and the
// run's entry in its group's presence list (presence.go). The features
// (mailbox, claims, questions, steering) are small types over it, each in
// its own file, each adding its endpoints to the relay's endpoint table
// (endpoints.go).
type core struct {
	h     *Host
	run   RunInfo
	log   zerolog.Logger
	peers jetstream.KeyValue // BucketPeers

	// ctx ends when the session stops serving (Detach or Close); every
	// goroutine of the session ends with it.
	ctx    context.Context
	cancel context.CancelFunc

	// joined is set once the run has a presence key (join).
	joined atomic.Bool

	mu       sync.Mutex
	presence Presence
	peerSeen map[string]time.Time // peers checkPeer found queued or running, and when
}

// newCore returns the core of a session acting as run, its context
// started: a steer may come before the socket serves.
func newCore(h *Host, run RunInfo) *core {
	ctx, cancel := context.WithCancel(context.Background())
	return &core{
		h:      h,
		run:    run,
		log:    h.log.With().Str("run_id", run.RunID).Str("pool", run.Pool).Str("group", run.Group).Logger(),
		ctx:    ctx,
		cancel: cancel,
		presence: Presence{RunID: run.RunID, Group: run.Group, Pool: run.Pool, Profile: run.Profile, State: run.State,
			StartedAt: run.StartedAt, Session: rand.Text()},
	}
}

// emit reports an event to the host's OnEvent callback.
func (c *core) emit(ev Event) {
	if c.h.cfg.OnEvent == nil {
		return
	}
	ev.RunID, ev.Group, ev.Time = c.run.RunID, c.run.Group, time.Now().UTC()
	c.h.cfg.OnEvent(ev)
}

// opContext bounds one NATS operation of a request made within ctx by
// Config.OpTimeout.
func (c *core) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.h.cfg.OpTimeout)
}

// sessionID returns the id the session writes in the run's presence key.
func (c *core) sessionID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.presence.Session
}

// state returns the run's state as the session last recorded it.
func (c *core) state() messages.State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.presence.State
}
