// Package runner is the run engine: it takes one delivered run request to
// an outcome. A delivery is read and checked against the run's record
// (delivery.go: decode, decide, claim, admit); a claimed run executes its
// stages (run.go: prepare → start → supervise → conclude, iterating the
// list stages.go builds) and records its outcome (record.go); classify
// (classify.go) is the one pure decision of which final state, which
// reason, retry or not. The worker (package worker) is its composition
// root: it pulls the requests, runs the fleet services and builds the
// stages' factories this engine is given.
//
// Delivery is at least once: every step is idempotent by run id.
package runner

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/live"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/runstate"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/stage/bridge"
	"github.com/jetcrew/jetcrew/worker/stage/coord"
	"github.com/jetcrew/jetcrew/worker/stage/proxy"
	"github.com/jetcrew/jetcrew/worker/stage/rundir"
	"github.com/jetcrew/jetcrew/worker/stage/secrets"
	"github.com/jetcrew/jetcrew/worker/stage/tree"
	"github.com/jetcrew/jetcrew/worker/warm"
)

// Config configures a Runner. Every field is required unless it says
// otherwise; the worker fills them from its own Config.
type Config struct {
	// WorkerID names the worker in run states, events and labels; Pool is
	// the pool it serves; Install identifies the installation
	// (jail.LabelInstall).
	WorkerID, Pool, Install string
	// Profiles are the resolved profiles requests may name: the worker's
	// set, which a reload stores anew; a delivery reads it when admitted.
	Profiles *profile.Set
	// Runtime runs the containers.
	Runtime jail.Runtime
	// NC and JS reach NATS: events, the runs' output, dead letters.
	NC *nats.Conn
	JS jetstream.JetStream
	// Store writes the runs' records.
	Store *runstate.Store
	// Groups admits each run into its coordination group before it
	// executes.
	Groups *coordination.Groups
	// Stages are the stages' per-worker factories.
	Stages Stages
	// Live is the worker's registry of what is live: the runs in flight
	// and their containers are held there, and each run's stages hold
	// what the run uses as the run (stage.Run.Holds).
	Live *live.Registry
	// DefaultTimeout bounds a run whose request and profile set none.
	DefaultTimeout time.Duration
	// StopGrace is the time between SIGTERM and SIGKILL when a run is
	// stopped.
	StopGrace time.Duration
	// InProgressInterval is how often a live run tells the server it is
	// still in progress (resetting AckWait).
	InProgressInterval time.Duration
	// MaxDeliver is the consumer's most deliveries of one request: a
	// retry on the last one fails the run.
	MaxDeliver int
	// Failpoint, when set, is called at each crash point a run passes
	// (stage.Failpoint*); nil in production.
	Failpoint func(name string)
	// Warm hands out warm containers: a run of a profile that keeps them
	// (profile.Profile.Warm for runs without a workspace,
	// WarmWorkspace for runs with one) claims one before its stages are
	// built (its placement, placement.go) and is handed it instead of a
	// new container. Nil keeps every run cold.
	Warm *warm.Pool
	// AdoptGrace is how long a redelivered request of a running run that no
	// live worker holds is handed back for, once, so that a successor of
	// its worker on its host may adopt its container first (delivery.go's
	// leaveToHolder); 0 starts the run again at once.
	AdoptGrace time.Duration
	// Metrics are the worker's metrics.
	Metrics *Metrics
	// Log receives the runs' logs.
	Log zerolog.Logger
}

// Stages are the per-worker factories of the stages a run's list is built
// from (stages.go).
type Stages struct {
	Secrets *secrets.Secrets
	RunDirs *rundir.Dirs
	Bridges *bridge.Bridges
	Trees   *tree.Trees
	Coord   *coord.Coord
	Proxies *proxy.Proxies
}

// Runner runs one worker's deliveries. Create it with New. Safe for
// concurrent use: the worker calls Handle from one goroutine per run slot.
type Runner struct {
	cfg Config
	log zerolog.Logger
	// live is the registry of the runs this worker holds (registry.go).
	live registry
	// stops counts container stops in flight (stopAsync).
	stops sync.WaitGroup
	// leaving is set when the worker stops leaving its runs to a
	// successor (Leave): a run whose context ends then leaves its
	// container running.
	leaving atomic.Bool
	// silentSince notes, by worker id, when a worker without heartbeat
	// answered no hold query (adopt.go's silent); guarded by silentMu.
	silentMu    sync.Mutex
	silentSince map[string]time.Time
	// testStages, when set, builds each run's stage list instead of
	// stagesFor's (the engine's tests, export_test.go); nil in production.
	testStages func(*stage.Run) []stage.Stage
}

// currentProfiles returns the profiles new deliveries may name
// (Config.Profiles as it is now). A delivery already admitted keeps the
// profile it was admitted with, a copy, to its end.
func (e *Runner) currentProfiles() profile.Profiles { return e.cfg.Profiles.Load() }

// New returns the Runner configured by cfg. It does no I/O.
func New(cfg Config) *Runner {
	if cfg.Failpoint == nil {
		cfg.Failpoint = func(string) {}
	}
	e := &Runner{cfg: cfg, log: cfg.Log, live: registry{runs: map[string]*entry{}, held: cfg.Live}}
	return e
}

// Leave makes every run in flight, once its context ends, leave its
// container running for a successor to adopt instead of stopping it and
// handing its request back (the worker's upgrade stop).
func (e *Runner) Leave() { e.leaving.Store(true) }

// Wait waits for every container stop the runner started (after the last
// run ended).
func (e *Runner) Wait() { e.stops.Wait() }

// stopAsync stops container c (SIGTERM, SIGKILL after StopGrace) in a
// goroutine Wait waits for, logging a failure with what.
func (e *Runner) stopAsync(c jail.Container, log zerolog.Logger, what string) {
	e.stops.Add(1)
	go func() {
		defer e.stops.Done()
		ctx, cancel := context.WithTimeout(context.Background(), e.cfg.StopGrace+30*time.Second)
		defer cancel()
		if err := c.Stop(ctx, e.cfg.StopGrace); err != nil && !errors.Is(err, context.Canceled) {
			log.Warn().Err(err).Msg(what)
		}
	}()
}

// digest returns the digest of profile p, the run's (profile.Profile.Digest:
// the one it was admitted with, whatever a reload did since).
func (e *Runner) digest(p *profile.Profile) string {
	return p.Digest()
}
