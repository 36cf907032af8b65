package coordination

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/jetcrew/jetcrew/internal/connlimit"
	"github.com/jetcrew/jetcrew/messages"
)

// SocketMode is the permission of a run's socket file: any user may connect,
// so the run's non-root process can, whatever uid it runs as and whatever uid
// mapping the container runtime applies. What keeps everyone else out is the
// directory: the worker creates the socket in a per-run directory that only
// that run's container mounts, under a parent only the worker can enter
// (0700). See StageRunDir.
const SocketMode os.FileMode = 0o666

// maxSocketPath is the longest unix socket path Linux accepts, in bytes
// (sun_path is 108 bytes including the terminating NUL).
const maxSocketPath = 107

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
// it; Detach or Close ends it.
type Session struct {
	h      *Host
	run    RunInfo
	path   string
	log    zerolog.Logger
	peers  jetstream.KeyValue
	limits *callLimits

	sockInfo os.FileInfo   // the socket file this session serves
	ln       *keptListener // the socket (CloseKeepSocket may leave it bound)
	srv      *http.Server
	ctx      context.Context // ends when the session stops serving
	cancel   context.CancelFunc
	bg       sync.WaitGroup // the HTTP server and the presence refresher

	steer *steerState // steering (steer.go)

	connected atomic.Bool
	// joined is set once the run has a presence key (join).
	joined atomic.Bool
	// claimed is set once the run claimed something in this session: Close
	// then removes its claims.
	claimed atomic.Bool
	// connectOnce emits the connected event; concurrent first requests wait
	// for it, so it precedes every other event of the session.
	connectOnce sync.Once
	inboxSem    chan struct{} // one inbox call at a time
	// questions are the session's open questions and the run's deadline.
	questions questionState
	// late are the waits for answers that come after their ask returned.
	late lateWaits

	mu        sync.Mutex
	presence  Presence
	cons      jetstream.Consumer
	consSeen  time.Time            // when an inbox call last proved the consumer there
	peerSeen  map[string]time.Time // peers checkPeer found queued or running, and when
	ownAll    []uint64             // stream sequences of this run's own "all" messages not yet skipped
	stopOnce  sync.Once
	stopErr   error
	closeOnce sync.Once
	closeErr  error
}

// Serve starts run's coordination session: it listens on socketPath (a unix
// socket, mode SocketMode, replacing a stale socket left there by a dead
// worker), creates or resumes the run's durable inbox consumer, and enters
// the run in its group's presence list. ctx bounds this setup only; the
// session lives until Detach or Close.
//
// Serve fails at once on an invalid run, a socket path longer than 107 bytes
// or held by something other than a socket, missing JetStream resources
// (Provision) or NATS being unreachable. A session already serving the same
// run on this Host (an earlier delivery winding down) is detached first:
// the later delivery supersedes it. On failure nothing is left behind but the inbox consumer.
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
	s := &Session{
		h:        h,
		run:      run,
		path:     socketPath,
		log:      h.log.With().Str("run_id", run.RunID).Str("pool", run.Pool).Str("group", run.Group).Logger(),
		limits:   newCallLimits(h.cfg),
		inboxSem: make(chan struct{}, 1),
		presence: Presence{RunID: run.RunID, Group: run.Group, Pool: run.Pool, Profile: run.Profile, State: run.State,
			StartedAt: run.StartedAt, Session: rand.Text()},
	}
	if old := h.register(s); old != nil {
		// A later delivery of the run supersedes the earlier one's session
		// (its own socket, in its own directory): it stops serving, and
		// its Close leaves this session's presence and inbox alone.
		s.log.Info().Msg("a later delivery of the run supersedes its earlier coordination session on this host")
		if err := old.Detach(ctx); err != nil {
			s.log.Warn().Err(err).Msg("detach the superseded session")
		}
	}
	ok := false
	defer func() {
		if !ok {
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

	if s.peers, err = h.peerBucket(ctx); err != nil {
		return nil, fmt.Errorf("coordination: %w", err)
	}
	// The inbox consumer is created on the first status or inbox call
	// (consumerInfo), not here: most runs never read an inbox, and creating
	// a durable consumer is the costliest step of a session (on an R3
	// cluster, a Raft group of its own). It delivers the whole stream from
	// its start, so messages sent before it exists are not missed.
	// A run that named a group joins its presence list now, so that its
	// peers' status lists it before it calls anything. A run that named
	// none is alone in the group of its own id: it joins when its bridge
	// first connects (handler), and a run that never connects costs no
	// presence write or delete.
	if run.Group != run.RunID {
		if err := s.join(ctx); err != nil {
			return nil, fmt.Errorf("coordination: join group %s: %w", run.GroupRef(), err)
		}
	}

	if err := s.startSteering(); err != nil {
		return nil, fmt.Errorf("coordination: %w", err)
	}
	s.sockInfo = sockInfo
	s.ln = &keptListener{UnixListener: ln}
	s.serve()
	ok = true
	s.log.Debug().Str("socket", socketPath).Msg("coordination session serving")
	return s, nil
}

// serve starts the session's HTTP server on its socket (at most
// MaxConnsPerSession connections at once, every request read whole within
// Config.RequestReadTimeout) and its presence refresher; both end when
// Detach or Close cancels the session's context.
func (s *Session) serve() {
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.srv = &http.Server{
		Handler:           s.handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       s.h.cfg.RequestReadTimeout,
		WriteTimeout:      responseWriteTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return context.WithValue(s.ctx, sessionKey{}, s) },
		// A unix socket speaks HTTP/1.1 to the relay: no HTTP/2 set-up
		// per session.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ErrorLog:     stdlog.New(logWriter{s.log}, "coordination socket: ", 0),
	}
	s.bg.Add(2)
	go func() {
		// Ends when Detach or Close shuts the server down.
		defer s.bg.Done()
		if err := s.srv.Serve(connlimit.New(MaxConnsPerSession, tooManyConns, nil).Listener(s.ln)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error().Err(err).Msg("coordination socket stopped serving")
		}
	}()
	go func() {
		// Ends when the session's context is cancelled by Detach or Close.
		defer s.bg.Done()
		s.refreshPresence()
	}()
}

// listenUnix listens on path, replacing a stale socket, and opens the
// socket's mode to SocketMode. It returns the socket file's info, so that
// the session removes only the socket it created. The usual case, a path
// in a freshly staged directory, costs the bind alone: a path that exists
// or a directory that does not is looked at only when the bind fails.
func listenUnix(path string) (*net.UnixListener, os.FileInfo, error) {
	if len(path) > maxSocketPath {
		return nil, nil, fmt.Errorf("socket path %q is %d bytes; unix sockets allow at most %d", path, len(path), maxSocketPath)
	}
	addr := &net.UnixAddr{Name: path, Net: "unix"}
	ln, err := net.ListenUnix("unix", addr)
	if err != nil {
		if perr := prepareSocketPath(path, err); perr != nil {
			return nil, nil, perr
		}
		if ln, err = net.ListenUnix("unix", addr); err != nil {
			return nil, nil, fmt.Errorf("listen on %s: %w", path, err)
		}
	}
	// Detach removes the file itself, and only when it is still ours: a
	// later session for the same run may have replaced it.
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (*net.UnixListener, os.FileInfo, error) {
		_ = ln.Close()
		_ = os.Remove(path)
		return nil, nil, err
	}
	if err := os.Chmod(path, SocketMode); err != nil {
		return fail(fmt.Errorf("chmod socket: %w", err))
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(fmt.Errorf("socket path: %w", err))
	}
	return ln, fi, nil
}

// prepareSocketPath makes path ready for a second bind after the first
// failed with bindErr: it removes a stale socket there (a dead worker's),
// refuses anything else there, and creates a missing directory.
func prepareSocketPath(path string, bindErr error) error {
	fi, err := os.Lstat(path)
	switch {
	case err == nil && fi.Mode().Type() != os.ModeSocket:
		return fmt.Errorf("socket path %s exists and is not a socket (%s)", path, fi.Mode().Type())
	case err == nil:
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("remove stale socket: %w", err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("socket path: %w", err)
	case !errors.Is(bindErr, syscall.ENOENT):
		return fmt.Errorf("listen on %s: %w", path, bindErr)
	default:
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("socket directory: %w", err)
		}
	}
	return nil
}

// RunID returns the id of the run the session acts as.
func (s *Session) RunID() string { return s.run.RunID }

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
	if s.ctx.Err() != nil {
		return fmt.Errorf("coordination: set state of run %s: the session has ended", s.run.RunID)
	}
	s.mu.Lock()
	s.presence.State = state
	if state == messages.StateRunning && s.presence.StartedAt.IsZero() {
		s.presence.StartedAt = time.Now().UTC()
	}
	s.mu.Unlock()
	if !s.joined.Load() {
		return nil // the state goes into the presence list when the run joins it
	}
	if err := s.putPresence(ctx); err != nil {
		return fmt.Errorf("coordination: set state of run %s: %w", s.run.RunID, err)
	}
	return nil
}

// join enters the run in its group's presence list; the refresher keeps the
// key alive from then on.
func (s *Session) join(ctx context.Context) error {
	if err := s.putPresence(ctx); err != nil {
		return err
	}
	s.joined.Store(true)
	return nil
}

// joinLate enters a run that named no group in its presence list when its
// bridge first connects; a failure is logged and retried by the refresher.
func (s *Session) joinLate() {
	if s.joined.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.h.cfg.OpTimeout)
	defer cancel()
	if err := s.join(ctx); err != nil {
		s.joined.Store(true) // the refresher writes it again
		s.log.Warn().Err(err).Msg("join coordination presence")
	}
}

func (s *Session) putPresence(ctx context.Context) error {
	s.mu.Lock()
	p := s.presence
	s.mu.Unlock()
	p.UpdatedAt = time.Now().UTC()
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	_, err = s.peers.Put(ctx, PeerKey(s.run.GroupRef(), s.run.RunID), b)
	return err
}

// refreshPresence rewrites the presence key every PeerTTL/3 until the
// session stops, so that it outlives the bucket's TTL only while the worker
// lives.
func (s *Session) refreshPresence() {
	t := time.NewTicker(PeerTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			if !s.joined.Load() {
				continue
			}
			ctx, cancel := context.WithTimeout(s.ctx, s.h.cfg.OpTimeout)
			if err := s.putPresence(ctx); err != nil && s.ctx.Err() == nil {
				s.log.Warn().Err(err).Msg("refresh coordination presence")
			}
			cancel()
		}
	}
}

// Detach stops serving the socket and removes it, but keeps the run's inbox
// consumer and presence key: use it when the run is handed back for another
// delivery (worker shutdown), so that its unread messages wait for the next
// session (the key expires after PeerTTL unless the run is served again).
// Requests in flight are cancelled; Detach waits for them until ctx ends.
// It is safe to call more than once, and before or after Close.
func (s *Session) Detach(ctx context.Context) error {
	s.stopOnce.Do(func() {
		defer s.flushRefusals()
		s.stopSteering()
		s.cancel()
		err := s.srv.Shutdown(ctx)
		if err != nil {
			_ = s.srv.Close()
		}
		s.bg.Wait()
		s.late.stop() // they end with s.ctx
		// A socket CloseKeepSocket parked stays bound, its file in place.
		if fi, lerr := os.Lstat(s.path); !s.ln.parked.Load() && lerr == nil && os.SameFile(fi, s.sockInfo) {
			if rmErr := os.Remove(s.path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
				err = errors.Join(err, rmErr)
			}
		}
		s.h.unregister(s)
		if err != nil {
			s.stopErr = fmt.Errorf("coordination: stop session of run %s: %w", s.run.RunID, err)
		}
	})
	return s.stopErr
}

// Close ends the run's coordination for good: it detaches (Detach), takes
// the run out of its group's presence list and deletes its inbox consumer,
// discarding unread messages (they stay in the stream until MaxAge). Call it
// when the run reaches a final state. What the session never created costs
// nothing: a run that never joined the presence list nor read its inbox
// sends nothing to NATS here.
//
// When another session has served the run since (the run was redelivered to
// another worker), Close only detaches: the run's presence and inbox belong
// to that session now. It returns the errors of each step, joined; a failed
// NATS step is cleaned up later by PeerTTL and
// Config.InboxInactiveThreshold. It is safe to call more than once.
func (s *Session) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		err := s.Detach(ctx)
		if !s.joined.Load() && s.consumer() == nil {
			// The run never joined its presence list nor read its inbox
			// in this session: nothing of it to remove. (An inbox an
			// earlier attempt created and this one never used expires
			// after Config.InboxInactiveThreshold.)
			s.closeErr = err
			return
		}
		key := PeerKey(s.run.GroupRef(), s.run.RunID)
		var rev uint64
		e, gerr := s.peers.Get(ctx, key)
		switch {
		case errors.Is(gerr, jetstream.ErrKeyNotFound):
		case gerr != nil:
			s.closeErr = errors.Join(err, fmt.Errorf("coordination: leave group %s: %w", s.run.GroupRef(), gerr))
			return
		default:
			var p Presence
			if json.Unmarshal(e.Value(), &p) == nil && p.Session != s.presence.Session {
				s.log.Info().Msg("run is served by another session; leaving its presence and inbox alone")
				s.closeErr = err
				return
			}
			rev = e.Revision()
		}
		if rev != 0 {
			// Only if nobody wrote the key since we read it.
			if derr := s.peers.Delete(ctx, key, jetstream.LastRevision(rev)); derr != nil {
				err = errors.Join(err, fmt.Errorf("coordination: leave group %s: %w", s.run.GroupRef(), derr))
			}
		}
		if s.claimed.Load() {
			err = errors.Join(err, s.releaseAll(ctx))
		}
		err = errors.Join(err, s.expireQuestions(ctx))
		if s.consumer() == nil {
			s.closeErr = err
			return
		}
		if derr := s.h.js.DeleteConsumer(ctx, StreamName, InboxName(s.run.RunID)); derr != nil && !errors.Is(derr, jetstream.ErrConsumerNotFound) {
			err = errors.Join(err, fmt.Errorf("coordination: delete inbox of run %s: %w", s.run.RunID, derr))
		}
		s.closeErr = err
	})
	return s.closeErr
}

// emit reports an event to the host's OnEvent callback.
func (s *Session) emit(ev Event) {
	if s.h.cfg.OnEvent == nil {
		return
	}
	ev.RunID, ev.Group, ev.Time = s.run.RunID, s.run.Group, time.Now().UTC()
	s.h.cfg.OnEvent(ev)
}

func rateLimit(perSecond float64) rate.Limit {
	if perSecond < 0 {
		return rate.Inf
	}
	return rate.Limit(perSecond)
}

// logWriter turns net/http's server log lines into debug entries.
type logWriter struct{ log zerolog.Logger }

// Write logs one line of net/http's at debug level.
func (w logWriter) Write(p []byte) (int, error) {
	w.log.Debug().Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}
