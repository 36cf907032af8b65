// Package worker takes run requests from a pool's durable JetStream consumer
// and runs each one in a hardened container through a Runtime, recording the
// run's state in the jetcrew-runs bucket and its events on JETCREW_EVENTS.
//
// Delivery is at least once: every step is idempotent by run id. A
// redelivered request whose run already reached a final state is acked
// without running again.
package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
)

// Config configures a Worker. Zero fields take the documented defaults (see
// WithDefaults).
type Config struct {
	// ID identifies the worker in run states, events and container labels.
	// Default: "<hostname>-<6 random hex digits>".
	ID string
	// Pool is the pool whose consumer the worker pulls from. Default
	// messages.DefaultPool.
	Pool string
	// Concurrency is the most runs at once. The worker never holds more
	// requests than free slots. Default 4.
	Concurrency int
	// Profiles are the profiles requests may name. Default DefaultProfiles().
	Profiles Profiles
	// Runtime runs the containers. Required.
	Runtime Runtime
	// Logger receives structured logs. Default: a disabled logger.
	Logger *zerolog.Logger
	// Provision sizes the streams and the consumer; its Pool is set from
	// Pool.
	Provision ProvisionConfig
	// InProgressInterval is how often a live run tells the server it is
	// still in progress (resetting AckWait). Default AckWait/3.
	InProgressInterval time.Duration
	// DefaultTimeout bounds a run whose request and profile set no timeout.
	// Default 1 hour.
	DefaultTimeout time.Duration
	// StopGrace is the time between SIGTERM and SIGKILL when a run is
	// stopped. Default 10 seconds.
	StopGrace time.Duration
	// FetchWait is how long one pull request waits for a message before it
	// is renewed. Default 30 seconds.
	FetchWait time.Duration
	// ReconcileInterval is how often orphaned containers are looked for.
	// Default 1 minute.
	ReconcileInterval time.Duration
	// OrphanGrace is how old a container with no live owner must be before
	// the reconciler removes it. Default 30 seconds.
	OrphanGrace time.Duration
	// LookupEnv reads the worker's environment for profiles' env_from_host.
	// Default os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// StateDir holds the per-run directories staged for containers (the
	// bridge socket and mcp.json), under StateDir/r/. It must be a path the
	// Docker engine sees as the worker does (same host), and short: a unix
	// socket path is at most 107 bytes. Default:
	// <os.TempDir()>/jetcrew-<worker id>.
	StateDir string
	// BridgePath is the host path of the static jetcrew-bridge binary,
	// mounted read-only into every run container whose profile has
	// coordination on. Default: jetcrew-bridge beside the running
	// executable. When it is missing, such runs are refused with that
	// reason.
	BridgePath string
	// Failpoint, when set, is called with the name of each crash point a
	// run passes (see the Failpoint* constants), so crash tests can kill
	// the worker process exactly there. Nil in production.
	Failpoint func(name string)
}

// Crash points passed to Config.Failpoint, in the order a run reaches them.
const (
	FailpointAfterFetch      = "after-fetch"       // request received, nothing recorded
	FailpointAfterStart      = "after-start"       // container created and started
	FailpointRunning         = "running"           // running state recorded
	FailpointAfterExit       = "after-exit"        // process exited, result not recorded
	FailpointAfterResult     = "after-result"      // final state recorded, request not removed
	FailpointAfterDeadLetter = "after-dead-letter" // dead letter published, request not removed
)

func (w *Worker) failpoint(name string) {
	if w.cfg.Failpoint != nil {
		w.cfg.Failpoint(name)
	}
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.ID == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "worker"
		}
		b := make([]byte, 3)
		_, _ = rand.Read(b)
		c.ID = sanitizeToken(host) + "-" + hex.EncodeToString(b)
	}
	if c.Pool == "" {
		c.Pool = messages.DefaultPool
	}
	if c.Concurrency == 0 {
		c.Concurrency = 4
	}
	if c.Profiles == nil {
		c.Profiles = DefaultProfiles()
	}
	if c.Logger == nil {
		l := zerolog.Nop()
		c.Logger = &l
	}
	c.Provision.Pool = c.Pool
	c.Provision = c.Provision.withDefaults()
	if c.InProgressInterval == 0 {
		c.InProgressInterval = c.Provision.AckWait / 3
	}
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = time.Hour
	}
	if c.StopGrace == 0 {
		c.StopGrace = 10 * time.Second
	}
	if c.FetchWait == 0 {
		c.FetchWait = 30 * time.Second
	}
	if c.ReconcileInterval == 0 {
		c.ReconcileInterval = time.Minute
	}
	if c.OrphanGrace == 0 {
		c.OrphanGrace = 30 * time.Second
	}
	if c.LookupEnv == nil {
		c.LookupEnv = os.LookupEnv
	}
	if c.StateDir == "" {
		c.StateDir = filepath.Join(os.TempDir(), "jetcrew-"+c.ID)
	}
	if c.BridgePath == "" {
		if exe, err := os.Executable(); err == nil {
			c.BridgePath = filepath.Join(filepath.Dir(exe), "jetcrew-bridge")
		}
	}
	return c
}

func (c Config) validate() error {
	if c.Runtime == nil {
		return errors.New("worker: Runtime is required")
	}
	if err := messages.ValidateToken("worker id", c.ID); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if err := messages.ValidateToken("pool", c.Pool); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if c.Concurrency < 1 {
		return fmt.Errorf("worker: concurrency %d must be at least 1", c.Concurrency)
	}
	if c.InProgressInterval >= c.Provision.AckWait {
		return fmt.Errorf("worker: in-progress interval %s must be shorter than AckWait %s", c.InProgressInterval, c.Provision.AckWait)
	}
	if !filepath.IsAbs(c.StateDir) {
		return fmt.Errorf("worker: state dir %q must be an absolute path", c.StateDir)
	}
	if c.FetchWait < time.Second {
		return fmt.Errorf("worker: fetch wait %s must be at least 1s", c.FetchWait)
	}
	return nil
}

func sanitizeToken(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '-'
		}
	}
	if len(b) > 40 {
		b = b[:40]
	}
	return string(b)
}

// Worker pulls run requests and runs them. Create it with New, then Start
// it; Stop ends it.
type Worker struct {
	cfg   Config
	nc    *nats.Conn
	js    jetstream.JetStream
	log   zerolog.Logger
	runs  jetstream.KeyValue
	live  jetstream.KeyValue
	cons  jetstream.Consumer
	coord *coordination.Host
	// install identifies this installation in container labels.
	install string

	reg     *prometheus.Registry
	metrics *metrics

	mu      sync.Mutex
	active  map[string]*activeRun // by run id
	started bool                  // Start was called
	running bool                  // Start succeeded
	stopped chan struct{}

	fetchCancel context.CancelFunc // stops pulling
	runsCancel  context.CancelFunc // aborts in-flight runs (hands them back)
	bgCancel    context.CancelFunc // stops heartbeat and reconciler
	unsubscribe func()             // ends the control subscriptions
	slots       sync.WaitGroup
	bg          sync.WaitGroup
}

type activeRun struct {
	run       *run
	container Container
}

// New returns a Worker using nc, configured by cfg with defaults applied.
// It returns an error for an invalid configuration; it does no I/O.
func New(nc *nats.Conn, cfg Config) (*Worker, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// An async publish whose server dies before acking would otherwise wait
	// forever: bound it, and the output publisher re-publishes it.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(opAttemptTimeout))
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	reg := prometheus.NewRegistry()
	return &Worker{
		reg:     reg,
		metrics: newMetrics(reg, cfg.ID, cfg.Pool),
		cfg:     cfg,
		nc:      nc,
		js:      js,
		log:     cfg.Logger.With().Str("worker", cfg.ID).Str("pool", cfg.Pool).Logger(),
		active:  make(map[string]*activeRun),
		stopped: make(chan struct{}),
	}, nil
}

// Registry returns the registry holding the worker's Prometheus metrics
// (jetcrew_runs_started_total, jetcrew_runs_finished_total{state},
// jetcrew_run_duration_seconds, jetcrew_queue_wait_seconds,
// jetcrew_runs_in_flight, jetcrew_redeliveries_total,
// jetcrew_coordination_messages_total{direction}), for an HTTP handler.
func (w *Worker) Registry() *prometheus.Registry { return w.reg }

// Ready reports whether the worker has started, is not stopping, and its
// NATS connection is up: the meaning of /readyz.
func (w *Worker) Ready() bool {
	w.mu.Lock()
	running := w.running
	w.mu.Unlock()
	select {
	case <-w.stopped:
		return false
	default:
	}
	return running && w.nc.IsConnected()
}

// ID returns the worker's id.
func (w *Worker) ID() string { return w.cfg.ID }

// Start provisions the JetStream resources, removes orphaned containers, and
// starts pulling: one pull request per run slot, so the worker never holds
// more requests than it can run. It returns once pulling has started, or an
// error when NATS, JetStream or the runtime cannot be set up. Start may be
// called once.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	if w.started {
		w.mu.Unlock()
		return errors.New("worker: already started")
	}
	w.started = true
	w.mu.Unlock()

	if err := w.checkOCIRuntimes(ctx); err != nil {
		return err
	}
	cons, err := Provision(ctx, w.js, w.cfg.Provision)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	w.cons = cons
	w.warnSizing(ctx)
	stream, err := w.js.Stream(ctx, messages.StreamRuns)
	if err != nil {
		return fmt.Errorf("worker: stream %s: %w", messages.StreamRuns, err)
	}
	w.install = strconv.FormatInt(stream.CachedInfo().Created.UnixNano(), 36)
	if err := coordination.Provision(ctx, w.js, w.cfg.Provision.Replicas); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	log := w.log
	w.coord, err = coordination.NewHost(w.nc, coordination.Config{Logger: &log, OnEvent: w.onCoordEvent})
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(w.cfg.StateDir, "r"), 0o700); err != nil {
		return fmt.Errorf("worker: state dir: %w", err)
	}
	if w.runs, err = w.js.KeyValue(ctx, messages.BucketRuns); err != nil {
		return fmt.Errorf("worker: bucket %s: %w", messages.BucketRuns, err)
	}
	if w.live, err = w.js.KeyValue(ctx, BucketWorkers); err != nil {
		return fmt.Errorf("worker: bucket %s: %w", BucketWorkers, err)
	}
	if err := w.heartbeat(ctx); err != nil {
		return fmt.Errorf("worker: heartbeat: %w", err)
	}
	if err := w.reconcile(ctx); err != nil {
		return fmt.Errorf("worker: reconcile containers: %w", err)
	}

	adv, err := w.js.Consumer(ctx, StreamAdvisories, consumerAdvisories)
	if err != nil {
		return fmt.Errorf("worker: consumer %s: %w", consumerAdvisories, err)
	}
	unsubscribe, err := w.subscribeControl()
	if err != nil {
		return fmt.Errorf("worker: subscribe to control subjects: %w", err)
	}
	w.unsubscribe = unsubscribe

	bgCtx, bgCancel := context.WithCancel(context.Background())
	fetchCtx, fetchCancel := context.WithCancel(context.Background())
	runsCtx, runsCancel := context.WithCancel(context.Background())
	w.bgCancel, w.fetchCancel, w.runsCancel = bgCancel, fetchCancel, runsCancel

	w.bg.Add(2)
	go w.background(bgCtx)
	go w.deadLetterer(bgCtx, adv)
	for i := 0; i < w.cfg.Concurrency; i++ {
		w.slots.Add(1)
		go w.slot(fetchCtx, runsCtx)
	}
	w.mu.Lock()
	w.running = true
	w.mu.Unlock()
	w.log.Info().Int("concurrency", w.cfg.Concurrency).Strs("profiles", w.cfg.Profiles.Names()).Msg("worker started")
	return nil
}

// Stop stops pulling new requests and waits for in-flight runs to finish.
// When ctx ends first, the remaining runs are stopped and their requests
// handed back to the stream (Nak) for another worker, and Stop returns
// ctx.Err() once they are. Stop is safe to call twice, or before Start.
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	if !w.running {
		w.mu.Unlock()
		return nil
	}
	w.mu.Unlock()
	w.fetchCancel()
	done := make(chan struct{})
	go func() { w.slots.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
		w.runsCancel()
		<-done
	}
	w.runsCancel()
	w.unsubscribe()
	w.bgCancel()
	w.bg.Wait()
	// The per-run directories are gone with their runs; remove their
	// parents when empty (a default state dir is per worker id).
	_ = os.Remove(filepath.Join(w.cfg.StateDir, "r"))
	_ = os.Remove(w.cfg.StateDir)
	// Remove the heartbeat so peers see this worker gone at once.
	dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = w.live.Delete(dctx, w.cfg.ID)
	cancel()
	select {
	case <-w.stopped:
	default:
		close(w.stopped)
		w.log.Info().Msg("worker stopped")
	}
	return err
}

// Stopped returns a channel closed once Stop has finished.
func (w *Worker) Stopped() <-chan struct{} { return w.stopped }

// slot is one run slot: it pulls one request, runs it, and pulls again,
// until fetchCtx ends. runsCtx aborts a run in flight.
func (w *Worker) slot(fetchCtx, runsCtx context.Context) {
	defer w.slots.Done()
	for fetchCtx.Err() == nil {
		pctx, cancel := context.WithTimeout(fetchCtx, w.cfg.FetchWait)
		batch, err := w.cons.Fetch(1, jetstream.FetchContext(pctx))
		if err != nil {
			cancel()
			if fetchCtx.Err() != nil {
				return
			}
			w.log.Warn().Err(err).Msg("fetch failed; retrying in 1s")
			sleepCtx(fetchCtx, time.Second)
			continue
		}
		for msg := range batch.Messages() {
			w.handle(runsCtx, msg)
		}
		cancel()
		if err := batch.Error(); err != nil && fetchCtx.Err() == nil &&
			!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
			w.log.Warn().Err(err).Msg("fetch ended with an error")
			sleepCtx(fetchCtx, time.Second)
		}
	}
}

// background refreshes the worker's heartbeat and runs the reconciler until
// ctx ends.
func (w *Worker) background(ctx context.Context) {
	defer w.bg.Done()
	hb := time.NewTicker(WorkerTTL / 3)
	defer hb.Stop()
	rc := time.NewTicker(w.cfg.ReconcileInterval)
	defer rc.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hb.C:
			if err := w.heartbeat(ctx); err != nil && ctx.Err() == nil {
				w.log.Warn().Err(err).Msg("heartbeat failed")
			}
		case <-rc.C:
			if err := w.reconcile(ctx); err != nil && ctx.Err() == nil {
				w.log.Warn().Err(err).Msg("reconcile failed")
			}
		}
	}
}

func (w *Worker) heartbeat(ctx context.Context) error {
	_, err := w.live.Put(ctx, w.cfg.ID, []byte(time.Now().UTC().Format(time.RFC3339Nano)))
	return err
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
