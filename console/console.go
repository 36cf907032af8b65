// Package console is jetcrew's web console: server-rendered pages of the
// pools, workers, runs, a run's live output, events and model usage, a
// group's conversation, the dead letters and the connections waiting for an
// operator (egress_ask), with cancel, replay, raising a paused run's budget
// and allowing or denying a waiting connection, live over
// server-sent events fed by NATS (a KV watch of jetcrew-runs, ordered
// consumers on JETCREW_EVENTS).
//
// It reads and acts only through package dispatcher, like the CLI. Its
// HTML, CSS and JavaScript are embedded; it loads nothing from elsewhere.
// It is safe as shipped: see docs/console.md, "Security".
package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

//go:embed templates/*.html static/*
var assets embed.FS

// DefaultListen is where `jetcrew up` and `jetcrew ui` serve the console
// unless told otherwise: loopback, on a port that is none of NATS's own
// (4222 clients, 6222 routes, 7422 leaf nodes, 8222 monitoring).
const DefaultListen = "127.0.0.1:4280"

// Config configures a Console.
type Config struct {
	// Dispatcher is what the console reads and acts through. Required.
	Dispatcher *dispatcher.Dispatcher
	// Token, when not empty, is required of every request: as
	// "Authorization: Bearer <token>" or through the login form. Required
	// to listen beyond loopback (CheckListen).
	Token string
	// Log receives the console's own errors. Default: none.
	Log zerolog.Logger
	// MaxStreams caps the live streams (server-sent events) served at
	// once; one more is refused with 503. Default 64.
	MaxStreams int
	// PageSize is the number of runs on one page of the runs list.
	// Default 50; at most 500.
	PageSize int
	// ActionTimeout bounds a cancel, replay or grant. Default 15
	// seconds.
	ActionTimeout time.Duration
	// QueueRead is how many run requests of JETCREW_RUNS the console reads,
	// oldest first, to list the runs no worker has taken yet (a submitter
	// writes no state: the request is their only record). A longer queue
	// shows its first QueueRead, and the runs page says so. Default
	// dispatcher.DefaultRequestRead; at most 1000.
	QueueRead int
	// ReadOnly serves the pages without their actions: no cancel, replay,
	// "Raise budget", Allow, Deny or Send button is shown, and their POSTs
	// are refused with 403. For a console whose NATS connection has the observer role,
	// which the server would refuse them anyway.
	ReadOnly bool
	// Operator names who answers an egress question from this console
	// (dispatcher.AnswerEgress's by, recorded in the run's egress event):
	// at most 128 characters. It is what the console says, not an
	// identity anyone proved. Default "console@<hostname>".
	Operator string
}

// WithDefaults returns a copy of cfg with zero fields set to their
// documented defaults.
func (cfg Config) WithDefaults() Config {
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = 64
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = 50
	}
	cfg.PageSize = min(cfg.PageSize, 500)
	if cfg.QueueRead <= 0 {
		cfg.QueueRead = dispatcher.DefaultRequestRead
	}
	cfg.QueueRead = min(cfg.QueueRead, 1000)
	if cfg.ActionTimeout <= 0 {
		cfg.ActionTimeout = 15 * time.Second
	}
	if cfg.Operator = strings.TrimSpace(cfg.Operator); cfg.Operator == "" {
		cfg.Operator = defaultOperator()
	}
	return cfg
}

// Console serves the web console. Create it with New, Start it, serve
// Handler, Stop it.
type Console struct {
	cfg   Config
	d     *dispatcher.Dispatcher
	csrf  string
	cache *cache
	queue queue
	// questions is the latest read of the open questions (questionsMemo).
	questions questionsMemo
	refused   refusals
	pages     map[string]*pageTemplate
	streams   chan struct{} // one token per live stream served

	stopOnce sync.Once
	cancel   context.CancelFunc
	done     chan struct{}
}

// New returns a Console for cfg, or an error when cfg.Dispatcher is nil or
// a template does not parse. It does no I/O.
func New(cfg Config) (*Console, error) {
	cfg = cfg.WithDefaults()
	if cfg.Dispatcher == nil {
		return nil, errors.New("console: nil dispatcher")
	}
	if len(cfg.Operator) > maxOperatorLen {
		return nil, fmt.Errorf("console: operator name longer than %d characters", maxOperatorLen)
	}
	pages, err := parsePages()
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	return &Console{
		cfg:     cfg,
		d:       cfg.Dispatcher,
		csrf:    newCSRFToken(),
		cache:   newCache(),
		pages:   pages,
		streams: make(chan struct{}, cfg.MaxStreams),
		done:    make(chan struct{}),
	}, nil
}

// Start starts following the jetcrew-runs bucket and waits until every
// stored run state is loaded, or until ctx ends (the console then serves
// what it has and keeps loading). A bucket that does not exist yet is
// looked for again every few seconds. The follower ends with Stop.
//
// It also puts a handler before the dispatcher's connection's asynchronous
// error handler (nats.Conn.SetErrorHandler; the one set before still gets
// every error): a permissions violation on the subject an action publishes
// to fails that action at once, naming the role it needs.
func (c *Console) Start(ctx context.Context) {
	c.refused.follow(c.d.Conn())
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.cancel = cancel
	go func() {
		defer close(c.done)
		c.cache.run(bg, c.d, 2*time.Second, func(err error) {
			c.cfg.Log.Warn().Err(err).Msg("console: following the runs bucket")
		})
	}()
	select {
	case <-c.cache.synced:
	case <-ctx.Done():
	}
}

// Stop ends the follower Start began and waits for it. Safe to call twice
// or before Start. Live streams end when the HTTP server that serves them
// shuts down.
func (c *Console) Stop() {
	c.stopOnce.Do(func() {
		if c.cancel == nil {
			close(c.done)
			return
		}
		c.cancel()
	})
	<-c.done
}

// Handler returns the console's HTTP handler: every page, action, live
// stream and asset, behind the protections of docs/console.md.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(assets, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("/login", c.login)
	mux.HandleFunc("GET /{$}", c.overview)
	mux.HandleFunc("GET /overview/fragment", c.overviewFragment)
	mux.HandleFunc("GET /live/overview", c.liveOverview)
	mux.HandleFunc("GET /runs", c.runsList)
	mux.HandleFunc("GET /live/runs", c.liveRuns)
	mux.HandleFunc("GET /runs/{id}", c.runPage)
	mux.HandleFunc("GET /live/run/{id}", c.liveRun)
	mux.HandleFunc("GET /runs/{id}/changes", c.changesFragment)
	mux.HandleFunc("GET /runs/{id}/result/{kind}", c.resultObject)
	mux.HandleFunc("GET /runs/{id}/artifacts/{name...}", c.artifact)
	replay := messages.SubjectReplay("*")
	send := messages.SubjectCoordFromOperator(messages.GroupRef{Pool: "*", Name: "*"}, "*")
	mux.HandleFunc("POST /runs/{id}/cancel", c.action(c.cancelRun, messages.SubjectCancel("*")))
	mux.HandleFunc("POST /runs/{id}/replay", c.action(c.replayRun, replay))
	mux.HandleFunc("POST /runs/{id}/budget", c.action(c.raiseBudget, "$KV."+messages.BucketBudgets+".>"))
	mux.HandleFunc("POST /runs/{id}/send", c.action(c.sendToRun, messages.SubjectSteer("*")))
	mux.HandleFunc("GET /groups/{pool}/{group}", c.groupPage)
	mux.HandleFunc("GET /groups/{pool}/{group}/attempts", c.groupAttempts)
	mux.HandleFunc("GET /live/group/{pool}/{group}", c.liveGroup)
	mux.HandleFunc("POST /groups/{pool}/{group}/send", c.action(c.sendToGroup, send))
	mux.HandleFunc("GET /dead-letters", c.deadLetters)
	mux.HandleFunc("POST /dead-letters/replay", c.action(c.replayDeadLetters, replay))
	mux.HandleFunc("POST /dead-letters/discard", c.action(c.discardDeadLetters, "$JS.API.STREAM.PURGE."+messages.StreamFailed))
	mux.HandleFunc("GET /questions", c.questionsPage)
	mux.HandleFunc("POST /questions/answer", c.action(c.answerQuestion, "$KV."+messages.BucketCoordQuestions+"."+messages.CoordAnswerKey(">")))
	mux.HandleFunc("POST /dead-letters/archive", c.action(c.archiveDeadLetters,
		"$JS.API.STREAM.PURGE."+messages.StreamFailed, messages.SubjectFailedArchived("*", "*")))
	mux.HandleFunc("GET /egress", c.egressPage)
	mux.HandleFunc("GET /egress/fragment", c.egressFragment)
	mux.HandleFunc("GET /live/egress", c.liveEgress)
	mux.HandleFunc("POST /egress/answer", c.action(c.answerEgress,
		"$KV."+messages.BucketEgressAsks+".>", "$KV."+messages.BucketEgressApprovals+".>"))
	return c.secure(mux)
}

// action wraps the handler of a POST that changes state, which publishes
// to subjects (patterns with * and >): refused with 403 when the console is
// read only (Config.ReadOnly). The request's context is cancelled the moment
// the server refuses a publish to one of subjects, its cause a
// *refusedError that c.message shows with a 403.
func (c *Console) action(h http.HandlerFunc, subjects ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c.cfg.ReadOnly {
			http.Error(w, "this console is read only", http.StatusForbidden)
			return
		}
		ctx, fail := context.WithCancelCause(r.Context())
		defer fail(nil)
		defer c.refused.watch(subjects, fail)()
		h(w, r.WithContext(ctx))
	}
}
