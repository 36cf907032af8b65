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
//
// It is the composition root of the console's parts, each a type of its
// own concern, in a file of its own: the pages (overviewPage, runsPage,
// runPage, results, groupPage, deadLetterPages, questionDesk, egressDesk),
// the operator's actions beside them (sender, budgets), the live streams
// (hub), the protections (guard), the run cache (cache) and the read of the
// queue (queue). What every page shares (the configuration, the dispatcher,
// the templates) is their core.
type Console struct {
	core  *core
	cache *cache
	guard *guard
	hub   *hub

	overview  *overviewPage
	list      *runsPage
	run       *runPage
	results   *results
	group     *groupPage
	send      *sender
	budgets   *budgets
	dead      *deadLetterPages
	questions *questionDesk
	egress    *egressDesk

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
	k := &core{cfg: cfg, d: cfg.Dispatcher, csrf: newCSRFToken(), pages: pages}
	runs := newCache()
	q := &queue{d: k.d, cache: runs, read: cfg.QueueRead}
	live := &hub{streams: make(chan struct{}, cfg.MaxStreams), cache: runs, d: k.d, log: cfg.Log}
	res := &results{core: k, cache: runs}
	qd := &questionDesk{core: k}
	ed := &egressDesk{core: k, hub: live}
	return &Console{
		core: k, cache: runs, guard: &guard{core: k}, hub: live,
		overview: &overviewPage{core: k, cache: runs, queue: q, questions: qd, hub: live},
		list:     &runsPage{core: k, cache: runs, queue: q, hub: live},
		run: &runPage{core: k, cache: runs, queue: q, hub: live, results: res,
			egress: ed, questions: qd},
		results:   res,
		group:     &groupPage{core: k, cache: runs, hub: live, results: res, questions: qd},
		send:      &sender{core: k},
		budgets:   &budgets{core: k},
		dead:      &deadLetterPages{core: k, cache: runs, queue: q},
		questions: qd,
		egress:    ed,
		done:      make(chan struct{}),
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
	c.guard.refused.follow(c.core.d.Conn())
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.cancel = cancel
	go func() {
		defer close(c.done)
		c.cache.run(bg, c.core.d, 2*time.Second, func(err error) {
			c.core.cfg.Log.Warn().Err(err).Msg("console: following the runs bucket")
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
	act := c.guard.action
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("/login", c.guard.login)
	mux.HandleFunc("GET /{$}", c.overview.serve)
	mux.HandleFunc("GET /overview/fragment", c.overview.fragment)
	mux.HandleFunc("GET /live/overview", c.overview.live)
	mux.HandleFunc("GET /runs", c.list.serve)
	mux.HandleFunc("GET /live/runs", c.list.live)
	mux.HandleFunc("GET /runs/{id}", c.run.serve)
	mux.HandleFunc("GET /live/run/{id}", c.run.live)
	mux.HandleFunc("GET /runs/{id}/changes", c.results.fragment)
	mux.HandleFunc("GET /runs/{id}/result/{kind}", c.results.object)
	mux.HandleFunc("GET /runs/{id}/artifacts/{name...}", c.results.artifact)
	replay := messages.SubjectReplay("*")
	send := messages.SubjectCoordFromOperator(messages.GroupRef{Pool: "*", Name: "*"}, "*")
	mux.HandleFunc("POST /runs/{id}/cancel", act(c.run.cancel, messages.SubjectCancel("*")))
	mux.HandleFunc("POST /runs/{id}/replay", act(c.run.replay, replay))
	mux.HandleFunc("POST /runs/{id}/budget", act(c.budgets.raise, "$KV."+messages.BucketBudgets+".>"))
	mux.HandleFunc("POST /runs/{id}/send", act(c.send.toRun, messages.SubjectSteer("*")))
	mux.HandleFunc("GET /groups/{pool}/{group}", c.group.serve)
	mux.HandleFunc("GET /groups/{pool}/{group}/attempts", c.group.attemptsFragment)
	mux.HandleFunc("GET /live/group/{pool}/{group}", c.group.live)
	mux.HandleFunc("POST /groups/{pool}/{group}/send", act(c.send.toGroup, send))
	mux.HandleFunc("GET /dead-letters", c.dead.serve)
	mux.HandleFunc("POST /dead-letters/replay", act(c.dead.replay, replay))
	mux.HandleFunc("POST /dead-letters/discard", act(c.dead.discard, "$JS.API.STREAM.PURGE."+messages.StreamFailed))
	mux.HandleFunc("GET /questions", c.questions.serve)
	mux.HandleFunc("POST /questions/answer", act(c.questions.answer, "$KV."+messages.BucketCoordQuestions+"."+messages.CoordAnswerKey(">")))
	mux.HandleFunc("POST /dead-letters/archive", act(c.dead.archive,
		"$JS.API.STREAM.PURGE."+messages.StreamFailed, messages.SubjectFailedArchived("*", "*")))
	mux.HandleFunc("GET /egress", c.egress.serve)
	mux.HandleFunc("GET /egress/fragment", c.egress.fragment)
	mux.HandleFunc("GET /live/egress", c.egress.live)
	mux.HandleFunc("POST /egress/answer", act(c.egress.answer,
		"$KV."+messages.BucketEgressAsks+".>", "$KV."+messages.BucketEgressApprovals+".>"))
	return c.guard.secure(mux)
}
