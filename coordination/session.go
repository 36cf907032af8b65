package coordination

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/internal/connlimit"
	"github.com/jetcrew/jetcrew/messages"
)

// Presence is the JSON document stored under a run's key
// ("<pool>.<group>.<run_id>") in BucketPeers.
type Presence struct {
	// RunID is the run's id.
	RunID string `json:"run_id"`
	// Group is the run's group, and Pool its pool.
	Group string `json:"group"`
	Pool  string `json:"pool"`
	// Profile is the run's profile.
	Profile string `json:"profile,omitempty"`
	// State is queued or running.
	State messages.State `json:"state"`
	// StartedAt is when the run's container started; zero while queued.
	StartedAt time.Time `json:"started_at,omitzero"`
	// UpdatedAt is when the key was last written.
	UpdatedAt time.Time `json:"updated_at"`
	// Session identifies the Session that wrote the key, so that a worker
	// that lost the run to another one does not remove the other's
	// presence and inbox when it closes.
	Session string `json:"session"`
}

// Session is one run's coordination: the socket its bridge talks to, its
// entry in the group's presence list and its inbox consumer. Serve creates
// it; Detach or Close ends it. It is a session core (core.go) and its
// features, each a type of its own serving its endpoints of the relay's
// endpoint table (endpoints.go): the mailbox (ops.go), claims (claims.go),
// questions (questions.go, reply.go, lateanswer.go) and steering
// (steer.go).
type Session struct {
	core   *core
	path   string
	limits *callLimits

	mail      *mailbox
	claims    *claims
	questions *questions
	steer     *steering

	sockInfo os.FileInfo   // the socket file this session serves
	ln       *keptListener // the socket (CloseKeepSocket may leave it bound)
	srv      *http.Server
	bg       sync.WaitGroup // the HTTP server and the presence refresher

	connected atomic.Bool
	// connectOnce emits the connected event; concurrent first requests wait
	// for it, so it precedes every other event of the session.
	connectOnce sync.Once

	stopOnce  sync.Once
	stopErr   error
	closeOnce sync.Once
	closeErr  error
}

// newSession returns run's session on h at socketPath, not yet serving.
func newSession(h *Host, run RunInfo, socketPath string) *Session {
	c := newCore(h, run)
	steer := newSteering(c)
	return &Session{
		core:      c,
		path:      socketPath,
		limits:    newCallLimits(c),
		mail:      newMailbox(c, steer.read),
		claims:    &claims{c: c},
		questions: &questions{c: c},
		steer:     steer,
	}
}

// Serve starts run's coordination session: it listens on socketPath (a unix
// socket, mode SocketMode, replacing a stale socket left there by a dead
// worker), subscribes to the run's steers, and enters the run in its
// group's presence list; the run's durable inbox consumer is created or
// resumed by its first status or inbox call. ctx bounds this setup only;
// the session lives until Detach or Close. A steer sent once Serve returned
// reaches the session.
//
// Serve fails at once on an invalid run, a socket path longer than 107 bytes
// or held by something other than a socket, missing JetStream resources
// (Provision) or NATS being unreachable. A session already serving the same
// run on this Host (an earlier delivery winding down) is detached first:
// the later delivery supersedes it. On failure nothing is left behind.
func (h *Host) Serve(ctx context.Context, run RunInfo, socketPath string) (*Session, error) {
	return h.serveOn(ctx, run, socketPath, func() (*net.UnixListener, os.FileInfo, error) { return listenUnix(socketPath) })
}

// serveOn is Serve with the socket at socketPath from listen: a new bind
// (Serve) or a socket kept bound (ServeSocket).
func (h *Host) serveOn(ctx context.Context, run RunInfo, socketPath string, listen func() (*net.UnixListener, os.FileInfo, error)) (*Session, error) {
	if run.State == "" {
		run.State = messages.StateQueued
	}
	if run.Pool == "" {
		run.Pool = messages.DefaultPool
	}
	if err := run.validate(); err != nil {
		return nil, fmt.Errorf("coordination: %w", err)
	}
	s := newSession(h, run, socketPath)
	if old := h.register(s); old != nil {
		// A later delivery of the run supersedes the earlier one's session
		// (its own socket, in its own directory): it stops serving, and
		// its Close leaves this session's presence and inbox alone.
		s.core.log.Info().Msg("a later delivery of the run supersedes its earlier coordination session on this host")
		if err := old.Detach(ctx); err != nil {
			s.core.log.Warn().Err(err).Msg("detach the superseded session")
		}
	}
	ok := false
	defer func() {
		if !ok {
			s.steer.stop()
			s.core.cancel()
			h.unregister(s)
		}
	}()
	ln, sockInfo, err := listen()
	if err != nil {
		return nil, fmt.Errorf("coordination: %w", err)
	}
	defer func() {
		if !ok {
			_ = ln.Close()
			_ = os.Remove(socketPath)
		}
	}()
	if err := s.setUp(ctx); err != nil {
		return nil, fmt.Errorf("coordination: %w", err)
	}
	if run.Adopted {
		if err := s.questions.resume(ctx); err != nil {
			s.core.log.Warn().Err(err).Msg("take over the open questions of the adopted run; their answers may not reach it")
		}
	}
	s.sockInfo = sockInfo
	s.ln = &keptListener{UnixListener: ln}
	s.serve()
	ok = true
	s.core.log.Debug().Str("socket", socketPath).Msg("coordination session serving")
	return s, nil
}

// setUp subscribes to the run's steers and enters a run that named a group
// in its presence list, so that its peers' status lists it before it calls
// anything. The round trip of that write, or of a flush for a run that
// named none, puts the steer subscription in place at the server before
// Serve returns.
//
// A run that named no group is alone in the group of its own id: it joins
// when its bridge first connects (handler), and a run that never connects
// costs no presence write or delete. The inbox consumer is created on the
// first status or inbox call (consumerInfo), not here: most runs never
// read an inbox, and creating a durable consumer is the costliest step of a
// session (on an R3 cluster, a Raft group of its own). It delivers the
// whole stream from its start, so messages sent before it exists are not
// missed.
func (s *Session) setUp(ctx context.Context) error {
	c := s.core
	var err error
	if c.peers, err = c.h.peers.get(ctx, c.h.js); err != nil {
		return err
	}
	if err := s.steer.start(); err != nil {
		return err
	}
	if c.run.Adopted {
		p, found, err := c.peer(ctx, c.run.RunID)
		if err != nil {
			return err
		}
		if found && p.Session != "" {
			c.mu.Lock()
			c.presence.Session = p.Session
			c.mu.Unlock()
		}
		// What the run claimed under its earlier session is its own:
		// released with the run, as this session's claims are.
		s.claims.claimed.Store(true)
	}
	if c.run.Group == c.run.RunID {
		octx, cancel := c.opContext(ctx)
		defer cancel()
		if err := c.h.nc.FlushWithContext(octx); err != nil {
			return fmt.Errorf("subscribe to steers: %w", err)
		}
		return nil
	}
	if err := c.join(ctx); err != nil {
		return fmt.Errorf("join group %s: %w", c.run.GroupRef(), err)
	}
	return nil
}

// serve starts the session's HTTP server on its socket (at most
// MaxConnsPerSession connections at once, every request read whole within
// Config.RequestReadTimeout) and its presence refresher; both end when
// Detach or Close cancels the session's context.
func (s *Session) serve() {
	c := s.core
	s.srv = &http.Server{
		Handler:           s.handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       c.h.cfg.RequestReadTimeout,
		WriteTimeout:      responseWriteTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return context.WithValue(c.ctx, sessionKey{}, s) },
		// A unix socket speaks HTTP/1.1 to the relay: no HTTP/2 set-up
		// per session.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ErrorLog:     stdlog.New(logWriter{c.log}, "coordination socket: ", 0),
	}
	s.bg.Add(2)
	go func() {
		// Ends when Detach or Close shuts the server down.
		defer s.bg.Done()
		if err := s.srv.Serve(connlimit.New(MaxConnsPerSession, tooManyConns, nil).Listener(s.ln)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.log.Error().Err(err).Msg("coordination socket stopped serving")
		}
	}()
	go func() {
		// Ends when the session's context is cancelled by Detach or Close.
		defer s.bg.Done()
		c.refreshPresence()
	}()
}

// RunID returns the id of the run the session acts as.
func (s *Session) RunID() string { return s.core.run.RunID }

// SocketPath returns the path of the session's socket on the worker's host.
func (s *Session) SocketPath() string { return s.path }

// Connected reports whether the run's bridge ever reached the socket in this
// session (the bridge announces itself when it starts).
func (s *Session) Connected() bool { return s.connected.Load() }

// SetState records the run's state in its group's presence list: queued or
// running (a final state takes the run out of its peers' lists; Close also
// removes the key). Moving to running sets the start time when the run was
// served without one. It returns an error when NATS cannot be reached (the
// next refresh retries) or when the session has ended.
func (s *Session) SetState(ctx context.Context, state messages.State) error {
	if s.core.ctx.Err() != nil {
		return fmt.Errorf("coordination: set state of run %s: the session has ended", s.RunID())
	}
	if err := s.core.setState(ctx, state); err != nil {
		return fmt.Errorf("coordination: set state of run %s: %w", s.RunID(), err)
	}
	return nil
}

// SetDeadline records when the run's timeout ends it: an ask waits at most
// until shortly before (askDeadlineMargin). The zero time means no limit
// but relay.MaxAskSeconds.
func (s *Session) SetDeadline(t time.Time) { s.questions.setDeadline(t) }

// SetSteerInput records whether the run's agent CLI takes streamed input
// (its launcher runs with --steer): steers are then handed to the launcher;
// otherwise they are answered queued at once.
func (s *Session) SetSteerInput(on bool) { s.steer.setInput(on) }

// Detach stops serving the socket and removes it, but keeps the run's inbox
// consumer and presence key: use it when the run is handed back for another
// delivery (worker shutdown), so that its unread messages wait for the next
// session (the key expires after PeerTTL unless the run is served again).
// Requests in flight are cancelled; Detach waits for them until ctx ends.
// It is safe to call more than once, and before or after Close.
func (s *Session) Detach(ctx context.Context) error {
	s.stopOnce.Do(func() {
		defer s.limits.flush()
		s.steer.stop()
		s.core.cancel()
		err := s.srv.Shutdown(ctx)
		if err != nil {
			_ = s.srv.Close()
		}
		s.bg.Wait()
		s.questions.late.stop() // they end with the session's context
		// A socket CloseKeepSocket parked stays bound, its file in place.
		if fi, lerr := os.Lstat(s.path); !s.ln.parked.Load() && lerr == nil && os.SameFile(fi, s.sockInfo) {
			if rmErr := os.Remove(s.path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
				err = errors.Join(err, rmErr)
			}
		}
		s.core.h.unregister(s)
		if err != nil {
			s.stopErr = fmt.Errorf("coordination: stop session of run %s: %w", s.RunID(), err)
		}
	})
	return s.stopErr
}

// Leave detaches the session (Detach) of a run its worker leaves running
// for a successor to adopt (issue 38): the run's open questions are kept,
// not dropped, and an ask waiting fails as interrupted
// (relay.CodeSessionEnded) rather than returning "no answer"; the session
// of the worker that adopts the run (RunInfo.Adopted) waits on them.
func (s *Session) Leave(ctx context.Context) error {
	s.questions.kept.Store(true)
	return s.Detach(ctx)
}

// Close ends the run's coordination for good: it detaches (Detach), takes
// the run out of its group's presence list, removes its claims and open
// questions, and deletes its inbox consumer, discarding unread messages
// (they stay in the stream until MaxAge). Call it when the run reaches a
// final state. What the session never created costs nothing: a run that
// never joined the presence list nor read its inbox sends nothing to NATS
// here.
//
// When another session has served the run since (the run was redelivered to
// another worker), Close only detaches: the run's presence and inbox belong
// to that session now. It returns the errors of each step, joined; a failed
// NATS step is cleaned up later by PeerTTL and
// Config.InboxInactiveThreshold. It is safe to call more than once.
func (s *Session) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		err := s.Detach(ctx)
		if !s.core.joined.Load() && s.mail.consumer() == nil {
			// The run never joined its presence list nor read its inbox
			// in this session: nothing of it to remove. (An inbox an
			// earlier attempt created and this one never used expires
			// after Config.InboxInactiveThreshold.)
			s.closeErr = err
			return
		}
		mine, lerr := s.core.leave(ctx)
		if err = errors.Join(err, lerr); !mine {
			s.closeErr = err
			return
		}
		s.closeErr = errors.Join(err, s.claims.releaseAll(ctx), s.questions.expire(ctx), s.mail.remove(ctx))
	})
	return s.closeErr
}

// logWriter turns net/http's server log lines into debug entries.
type logWriter struct{ log zerolog.Logger }

// Write logs one line of net/http's at debug level.
func (w logWriter) Write(p []byte) (int, error) {
	w.log.Debug().Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}
