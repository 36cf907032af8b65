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
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/live"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/runner"
	"github.com/jetcrew/jetcrew/worker/runstate"
	"github.com/jetcrew/jetcrew/worker/stage/bridge"
	"github.com/jetcrew/jetcrew/worker/stage/coord"
	"github.com/jetcrew/jetcrew/worker/stage/proxy"
	"github.com/jetcrew/jetcrew/worker/stage/rundir"
	"github.com/jetcrew/jetcrew/worker/stage/secrets"
	"github.com/jetcrew/jetcrew/worker/stage/tree"
	"github.com/jetcrew/jetcrew/worker/warm"
)

// Worker pulls run requests and runs them. Create it with New, then Start
// it; Stop ends it.
type Worker struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream
	log zerolog.Logger

	reg     *prometheus.Registry
	metrics *runner.Metrics
	// profiles are the profiles in use (Config.Profiles, then the last
	// reload's), the one set every part reads; reloadMu serializes
	// ReloadProfiles.
	profiles *profile.Set
	reloadMu sync.Mutex
	// live is the registry of what is live on this worker: runs,
	// containers, volumes, directories, what they hold.
	live *live.Registry

	// Set up by Start (setUp): install identifies this installation in
	// container labels, store owns every write of the jetcrew-runs bucket,
	// cons is the pool's consumer.
	install string
	store   *runstate.Store
	cons    jetstream.Consumer
	// The parts (parts), and the stages' factories and the run engine the
	// stages part makes (compose).
	dir      *stateDir
	presence *presence
	runDirs  *rundir.Dirs
	bridges  *bridge.Bridges
	trees    *tree.Trees
	proxies  *proxy.Proxies
	warm     *warm.Pool
	runs     *runner.Runner
	// life is the parts in start order and how many started.
	life lifecycle
	// pull is the puller of requests, which also runs adopted runs; rc the
	// reconciler, whose pass adopts orphaned runs (adopt.go).
	pull *puller
	rc   *reconciler
	// leaving is set by Leave: the worker stops leaving its runs running
	// for a successor.
	leaving atomic.Bool

	mu       sync.Mutex
	started  bool // Start was called
	running  bool // Start succeeded
	stopped  chan struct{}
	stopOnce sync.Once
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
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(runstate.OpAttemptTimeout))
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	reg := prometheus.NewRegistry()
	return &Worker{
		profiles: profile.NewSet(cfg.Profiles),
		reg:      reg,
		metrics:  runner.NewMetrics(reg, cfg.ID, cfg.Pool),
		cfg:      cfg,
		nc:       nc,
		js:       js,
		log:      cfg.Logger.With().Str("worker", cfg.ID).Str("pool", cfg.Pool).Logger(),
		live:     &live.Registry{},
		stopped:  make(chan struct{}),
	}, nil
}

// Registry returns the registry holding the worker's Prometheus metrics
// (jetcrew_runs_started_total, jetcrew_runs_finished_total{state},
// jetcrew_run_duration_seconds, jetcrew_queue_wait_seconds,
// jetcrew_runs_in_flight, jetcrew_redeliveries_total,
// jetcrew_coordination_messages_total{direction} and, with egress
// profiles, jetcrew_egress_attempts_total{result}), for an HTTP handler.
func (w *Worker) Registry() *prometheus.Registry { return w.reg }

// Ready reports whether the worker has started, is not stopping, its NATS
// connection is up and, with egress profiles, its egress proof passed: the
// meaning of /readyz.
func (w *Worker) Ready() bool {
	w.mu.Lock()
	running := w.running
	w.mu.Unlock()
	select {
	case <-w.stopped:
		return false
	default:
	}
	return running && w.nc.IsConnected() && w.proxies.Ready()
}

// ID returns the worker's id.
func (w *Worker) ID() string { return w.cfg.ID }

// KillEgress cuts the egress proxy of run runID as a crash would: its
// listener and every open connection. Its supervisor reopens it after
// Config.EgressRestartDelay; meanwhile the run's connections fail (the
// container has no other way out). It reports whether the run is live here
// with an egress proxy. For drills and tests.
func (w *Worker) KillEgress(runID string) bool {
	w.mu.Lock()
	running := w.running
	w.mu.Unlock()
	return running && w.runs.KillEgress(runID)
}

// Start checks and provisions what the worker needs (setUp), then starts
// its parts in their declared order (parts): its key in the workers
// bucket, its state directory, the stages and the run engine, the
// heartbeat, the reconciler (which removes orphaned containers before
// Start returns), the sweeper, the dead-letterer, the cancel listener, the
// egress proxies, the workspaces, the warm pool and the pull loop (one
// pull request per run slot, so the worker never holds more requests than
// it can run). It returns once they run, or an error when NATS, JetStream,
// the runtime or a part cannot be set up; the parts started by then are
// stopped again, in reverse. Start may be called once.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	if w.started {
		w.mu.Unlock()
		return errors.New("worker: already started")
	}
	w.started = true
	w.mu.Unlock()
	if err := w.setUp(ctx); err != nil {
		return err
	}
	w.life = lifecycle{parts: w.parts()}
	if err := w.life.start(ctx); err != nil {
		return err
	}
	w.mu.Lock()
	w.running = true
	w.mu.Unlock()
	w.log.Info().Int("concurrency", w.cfg.Concurrency).Strs("profiles", w.profiles.Load().Names()).Msg("worker started")
	return nil
}

// parts returns the worker's parts in the order Start starts them; Stop
// stops them in the reverse order. So a worker that stops first stops
// fetching, then removes its warm pool (no run claims a warm container
// any more; one that claimed one has it), lets the runs in flight finish
// until Stop's ctx ends (then hands them back), ends the git resolutions,
// stops its background services, waits for the container stops it began,
// drains the stages' directories, removes its state directory and, last,
// deletes its key in the workers bucket, so peers see it gone at once.
func (w *Worker) parts() []namedPart {
	c := w.cfg
	w.presence = &presence{js: w.js, id: c.ID}
	w.dir = &stateDir{configured: c.StateDir, root: c.StateRoot, id: c.ID, log: w.log, inUse: w.mountedUnder}
	pull := &puller{cons: w.cons, slots: c.Concurrency, wait: c.FetchWait, log: w.log,
		handle: func(ctx context.Context, msg jetstream.Msg) { w.runs.Handle(ctx, msg) }}
	w.pull, w.rc = pull, w.newReconciler()
	return []namedPart{
		{"presence", w.presence},
		{"state directory", w.dir},
		{"stages", hooks{start: w.compose, stop: w.drainStages}},
		{"heartbeat", &heartbeat{presence: w.presence, value: w.presenceValue, ensure: w.ensureProvisioned,
			interval: messages.WorkerTTL / 3, log: w.log}},
		{"reconciler", w.rc},
		{"dead-letterer", &deadLetterer{js: w.js, store: w.store, workerID: c.ID, wait: c.FetchWait, retry: 5 * time.Second, log: w.log,
			removeContainers: func(ctx context.Context, id, recorded string) error {
				return w.runs.RemoveRunContainers(ctx, id, recorded)
			},
			liveRun: w.liveRun}},
		{"cancel listener", &cancelListener{nc: w.nc, store: w.store, workerID: c.ID, log: w.log,
			stopRun: func(id string) (messages.CancelReply, bool) { return w.runs.StopRun(id) },
			holds:   func(id string) bool { return w.runs.Holds(id) }}},
		{"egress proxies", made(func() part { return w.proxies })},
		{"workspaces", made(func() part { return w.trees })},
		{"runs in flight", inFlight{p: pull, leaving: w.leaving.Load}},
		{"warm pool", made(func() part { return w.warm })},
		{"fetching", pull},
		// Orphaned runs are adopted once the puller can run them; what
		// the stages left behind is swept after, so a run directory a
		// successor adopts is never taken for a leftover.
		{"adoption", hooks{start: w.adoptOrphans}},
		{"sweeper", w.newSweeper()},
	}
}

// setUp checks the OCI runtimes the profiles name (listed by the engine,
// then each proved by a container), provisions the streams, buckets and
// consumers the worker uses and the coordination host's, and opens the
// runs' store: what the parts need before they start, and nothing to undo.
func (w *Worker) setUp(ctx context.Context) error {
	runtimes := &runtimeCheck{runtime: w.cfg.Runtime, profiles: w.profiles.Load(), workerID: w.cfg.ID, log: w.log}
	if err := runtimes.check(ctx); err != nil {
		return err
	}
	err := w.untilProvisioned(ctx, "jetcrew's streams, buckets and consumer", func(ctx context.Context) (err error) {
		w.cons, err = Provision(ctx, w.js, w.cfg.Provision)
		return err
	})
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	w.warnSizing(ctx)
	stream, err := w.js.Stream(ctx, messages.StreamRuns)
	if err != nil {
		return fmt.Errorf("worker: stream %s: %w", messages.StreamRuns, err)
	}
	w.install = strconv.FormatInt(stream.CachedInfo().Created.UnixNano(), 36)
	runtimes.install = w.install
	if err := runtimes.prove(ctx); err != nil {
		return err
	}
	if err := w.untilProvisioned(ctx, "coordination's stream and bucket", func(ctx context.Context) error {
		return coordination.Provision(ctx, w.js, w.cfg.Provision.Replicas)
	}); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	runs, err := w.js.KeyValue(ctx, messages.BucketRuns)
	if err != nil {
		return fmt.Errorf("worker: bucket %s: %w", messages.BucketRuns, err)
	}
	w.store = runstate.NewStore(runs, w.js, w.cfg.ID, w.log)
	return nil
}

// compose builds the stages' factories, in the state directory, and the
// run engine (the composition root of a run), and makes sure the
// workspace and result buckets exist before any client needs them (a
// submitter may not create streams): the stages part's start.
func (w *Worker) compose(ctx context.Context) error {
	c, dir := w.cfg, w.dir.path
	holds := w.live.For(live.Worker)
	w.runDirs = rundir.New(filepath.Join(dir, "r"), filepath.Join(dir, "p"), c.Concurrency, holds, w.log)
	w.bridges = bridge.New(c.BridgePath, filepath.Join(dir, "bin"), holds)
	w.trees = tree.New(tree.Deps{Config: c.Workspace, Runtime: c.Runtime, JS: w.js, StateDir: dir, Tool: c.WorkspaceTool,
		StopGrace: c.StopGrace, Holds: holds, Log: w.log, Profiles: w.profiles, RunState: w.loadRunState, InUse: w.mountedUnder})
	w.proxies = proxy.New(proxy.Config{WorkerID: c.ID, Pool: c.Pool, Install: w.install, Profiles: w.profiles, NC: w.nc,
		Registry: w.reg, Resolver: c.EgressResolver, UpstreamRoots: c.EgressUpstreamRoots, RestartDelay: c.EgressRestartDelay,
		CADir: c.EgressCADir, LookupEnv: c.LookupEnv, Log: w.log, Prices: c.Prices,
		Proof: proxy.ProofConfig{Runtime: c.Runtime, Image: c.EgressProbeImage, Outside: c.EgressProbeOutside, Ports: c.EgressProbePorts,
			Bridge: w.bridges.Stage, Dir: w.runDirs.Path}})
	log := w.log
	// The host reports coordination steps to the run engine, made below.
	host, err := coordination.NewHost(w.nc, coordination.Config{Logger: &log, OnEvent: func(ev coordination.Event) { w.runs.OnCoordEvent(ev) }})
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	stages := runner.Stages{Secrets: secrets.New(c.LookupEnv), RunDirs: w.runDirs, Bridges: w.bridges, Trees: w.trees,
		Coord: coord.New(host), Proxies: w.proxies}
	w.warm = warm.New(warm.Config{Runtime: c.Runtime, Profiles: w.profiles, WorkerID: c.ID, Install: w.install, Pool: c.Pool,
		Max: c.WarmMax, MaxIdle: c.WarmMaxIdle, Make: stages.MakeWarm, Workspaces: true,
		Live: w.live, Registry: w.reg, Log: w.log})
	w.runs = runner.New(runner.Config{
		WorkerID: c.ID, Pool: c.Pool, Install: w.install, Profiles: w.profiles, Runtime: c.Runtime,
		NC: w.nc, JS: w.js, Store: w.store, Groups: coordination.NewGroups(w.js), Live: w.live, Stages: stages,
		DefaultTimeout: c.DefaultTimeout, StopGrace: c.StopGrace, InProgressInterval: c.InProgressInterval,
		MaxDeliver: c.Provision.MaxDeliver, Failpoint: c.Failpoint, Warm: w.warm, Metrics: w.metrics, Log: w.log,
		AdoptGrace: c.AdoptGrace,
	})
	if _, _, err := w.trees.EnsureBuckets(ctx); err != nil {
		return fmt.Errorf("worker: workspace buckets: %w", err)
	}
	return nil
}

// drainStages waits for every container stop the run engine began, then
// removes the stages' directories when empty (a default state dir is per
// worker id): the per-run directories are gone with their runs, and no
// run holds a staged binary any more. The stages part's stop. It returns
// nil.
func (w *Worker) drainStages(context.Context) error {
	w.runs.Wait()
	w.bridges.Drain()
	w.runDirs.Drain()
	w.trees.Drain()
	return nil
}

// Leave stops the worker leaving its runs to a successor, for an upgrade
// or a restart: their containers run on, their records and requests stay
// as they are, and a worker started on the same engine (the next process
// of this one, or any other of the installation there) adopts them and
// carries them to their ends, the agents never restarted (issue 38,
// docs/operations.md "Upgrades"). The worker's heartbeat key is deleted
// as it stops, so the successor need not wait for it to expire. Then it
// stops as Stop does. jetcrew worker and jetcrew up call it on SIGUSR2.
func (w *Worker) Leave(ctx context.Context) error {
	w.leaving.Store(true)
	if w.runs != nil {
		w.runs.Leave()
	}
	if w.dir != nil {
		w.dir.keep.Store(true)
	}
	return w.Stop(ctx)
}

// Stop stops the worker's parts in the reverse of their start order
// (parts): it stops pulling new requests, removes the warm pool and waits
// for in-flight runs to finish. When ctx ends first, the remaining runs
// are stopped and their requests handed back to the stream (Nak) for
// another worker, and Stop returns ctx.Err() once they are. Then it stops
// the other parts, each waiting for what it started, the container stops
// the runs began included. Stop is safe to call twice, concurrently, or
// before Start: a second call waits for the first (or its own ctx).
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	running := w.running
	w.mu.Unlock()
	if !running {
		return nil
	}
	first := false
	w.stopOnce.Do(func() { first = true })
	if !first {
		select {
		case <-w.stopped:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	err := w.life.stop(ctx)
	close(w.stopped)
	w.log.Info().Msg("worker stopped")
	return err
}

// Stopped returns a channel closed once Stop has finished.
func (w *Worker) Stopped() <-chan struct{} { return w.stopped }

// loadRunState reads the state a worker recorded for run id, for a
// request whose workspace names an earlier run (tree.Deps.RunState).
func (w *Worker) loadRunState(ctx context.Context, id string) (messages.RunState, error) {
	st, _, err := w.store.Load(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return st, fmt.Errorf("run %s: %w", id, tree.ErrRunNotFound)
	}
	return st, err
}
