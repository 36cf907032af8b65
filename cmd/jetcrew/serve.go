package main

import (
	"cmp"
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage/tree"
	"github.com/jetcrew/jetcrew/worker/warm"
)

// workerOptions are the flags of the worker `up` and `worker` start.
type workerOptions struct {
	bridge            string
	stateDir          string
	stateRoot         string
	profiles          string
	concurrency       int
	pool              string
	id                string
	drainTimeout      time.Duration
	ackWait           time.Duration
	maxDeliver        int
	maxAckPending     int
	orphanGrace       time.Duration
	reconcileInterval time.Duration
	warmMax           int
	warmMaxIdle       time.Duration
	prices            string         // --prices
	priceTable        *usage.Prices  // loaded from prices by check
	metricsAddr       string         // --metrics-addr; see metrics.go
	replicas          int            // --replicas (worker only); see metrics.go
	egressCADir       string         // --egress-ca-dir; see egress.go
	egressCAs         []string       // --egress-ca; see egress.go
	egressRoots       *x509.CertPool // loaded from egressCAs by check
	workspace         tree.Config    // --workspace-*, --result-*; see workspace.go
	caps              streamCapFlags
}

func (o *workerOptions) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.profiles, "profiles", "", "TOML profile file (default: the built-in shell profile only)")
	fs.StringVar(&o.bridge, "bridge", "", "a separate bridge binary (static jetcrew-bridge) to stage into runs (default: this jetcrew executable, run as `jetcrew bridge`)")
	fs.StringVar(&o.stateRoot, "state-root", "", "where a worker without --state-dir makes its private state directory (absolute; shared by the workers of a host: each holds a lock on its own, and a starting worker removes only those whose lock is free) (default /var/lib/jetcrew/state, as root, else $TMPDIR)")
	fs.StringVar(&o.stateDir, "state-dir", "", "a fixed state directory (absolute; missing, or the worker's with mode 0700) for the runs' directories and staged binaries; emptied of them when the worker stops (default: a new private one under /var/lib/jetcrew/state, as root, else $TMPDIR, removed whole when the worker stops)")
	fs.IntVar(&o.concurrency, "concurrency", 4, "most runs at once")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 30*time.Second,
		"on stop, how long to let runs finish before stopping them and handing them back")
	fs.DurationVar(&o.ackWait, "ack-wait", 30*time.Second,
		"the pool consumer's ack wait: a request held this long without an ack or progress is redelivered (every worker of a pool must use the same)")
	fs.IntVar(&o.maxDeliver, "max-deliver", 5,
		"the pool consumer's max deliver: deliveries of one request before it fails (every worker of a pool must use the same)")
	fs.IntVar(&o.maxAckPending, "max-ack-pending", 1024,
		"the pool consumer's max ack pending: requests held by all its workers at once; delivery stalls silently when reached, so keep it at least the sum of the pool's --concurrency (every worker of a pool must use the same)")
	fs.DurationVar(&o.orphanGrace, "orphan-grace", 30*time.Second,
		"how old a container with no live owner must be before it is removed")
	fs.DurationVar(&o.reconcileInterval, "reconcile-interval", time.Minute,
		"how often to look for orphaned containers")
	fs.IntVar(&o.warmMax, "warm-max", warm.DefaultMax,
		"most warm containers kept, all profiles together (a profile's warm asks for them; profiles in name order fill it); 0 keeps none")
	fs.DurationVar(&o.warmMaxIdle, "warm-max-idle", warm.DefaultMaxIdle,
		"how long a warm container waits for a run before it is replaced")
	fs.StringVar(&o.prices, "prices", "",
		"TOML price table (USD per million input, output, cache_read, cache_write and cache_write_1h tokens, USD per 1,000 web_search, long-prompt tiers, by model) pricing the model usage the egress proxy meters on egress_inject hosts (default: none; only tokens are counted, and max_cost_usd never trips)")
	o.addMetricsFlag(fs)
	addWorkerWorkspaceFlags(fs, &o.workspace)
	o.caps.add(fs)
	o.addEgressFlags(fs)
}

func (o *workerOptions) addPoolFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.pool, "pool", "", "pool to take runs from (default \"default\")")
	fs.StringVar(&o.id, "id", "", "worker id (default <hostname>-<random>)")
}

// check validates the options and loads the profiles; a mistake is a usage
// error, found before anything starts.
func (o *workerOptions) check() (profile.Profiles, error) {
	if o.concurrency < 1 {
		return nil, usageError(fmt.Errorf("--concurrency %d: must be at least 1", o.concurrency))
	}
	if o.drainTimeout < 0 {
		return nil, usageError(fmt.Errorf("--drain-timeout %s: must not be negative", o.drainTimeout))
	}
	if o.ackWait < time.Second {
		return nil, usageError(fmt.Errorf("--ack-wait %s: must be at least 1s", o.ackWait))
	}
	if o.maxDeliver < 1 {
		return nil, usageError(fmt.Errorf("--max-deliver %d: must be at least 1", o.maxDeliver))
	}
	if o.maxAckPending < 1 {
		return nil, usageError(fmt.Errorf("--max-ack-pending %d: must be at least 1", o.maxAckPending))
	}
	if o.maxAckPending < o.concurrency {
		return nil, usageError(fmt.Errorf("--max-ack-pending %d is below --concurrency %d: the worker could never fill its slots", o.maxAckPending, o.concurrency))
	}
	if o.orphanGrace <= 0 {
		return nil, usageError(fmt.Errorf("--orphan-grace %s: must be positive", o.orphanGrace))
	}
	if o.reconcileInterval <= 0 {
		return nil, usageError(fmt.Errorf("--reconcile-interval %s: must be positive", o.reconcileInterval))
	}
	if o.warmMax < 0 {
		return nil, usageError(fmt.Errorf("--warm-max %d: must not be negative", o.warmMax))
	}
	if o.warmMaxIdle < time.Second {
		return nil, usageError(fmt.Errorf("--warm-max-idle %s: must be at least 1s", o.warmMaxIdle))
	}
	if err := o.caps.check(); err != nil {
		return nil, err
	}
	if o.caps.runsPerPool > 0 && int64(o.concurrency) > o.caps.runsPerPool {
		return nil, usageError(fmt.Errorf("--runs-max-per-pool %d is below --concurrency %d: the pool never holds enough requests to fill the worker's slots", o.caps.runsPerPool, o.concurrency))
	}
	if err := o.checkScaleOut(); err != nil {
		return nil, err
	}
	if err := o.checkEgress(); err != nil {
		return nil, err
	}
	if o.prices != "" {
		p, err := usage.LoadPrices(o.prices)
		if err != nil {
			return nil, usageError(fmt.Errorf("--prices: %w", err))
		}
		o.priceTable = p
	}
	if o.profiles == "" {
		return profile.DefaultProfiles(), nil
	}
	ps, err := profile.LoadProfiles(o.profiles)
	if err != nil {
		return nil, usageError(err)
	}
	return ps, nil
}

// serveWorker runs a worker on nc until ctx ends or failed delivers a
// reason, then stops it: runs in flight get o.drainTimeout (cut short by a
// second interrupt) to finish, after which they are stopped and handed back
// to the stream. ready is called once the worker has started (its streams
// exist). An error means the worker could not start or failed is what ended
// it; a stop asked for through ctx returns nil.
func (a workerCmds) serveWorker(ctx context.Context, nc *nats.Conn, o workerOptions, profiles profile.Profiles, ready func(*worker.Worker), failed <-chan string) error {
	rt, closeRuntime, err := a.newRuntime(ctx, a.log)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while connecting
		}
		return fmt.Errorf("container runtime: %w", err)
	}
	defer func() {
		if err := closeRuntime(); err != nil {
			a.log.Warn().Err(err).Msg("close container runtime")
		}
	}()
	w, err := worker.New(nc, a.workerConfig(nc, o, profiles, rt))
	if err != nil {
		return err
	}
	stopMetrics, err := a.serveMetrics(o.metricsAddr, w)
	if err != nil {
		return err
	}
	defer stopMetrics()
	if err := w.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if ready != nil {
		ready(w)
	}

	failure, leave := a.waitForStop(ctx, w, o, failed)
	if leave {
		// SIGUSR2: the runs in flight go on, for the next worker on this
		// engine to adopt (an upgrade).
		lctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := w.Leave(lctx); err != nil {
			a.log.Warn().Err(err).Msg("stop leaving the runs")
		}
		return nil
	}
	drainCtx, cancel := context.WithTimeout(context.Background(), o.drainTimeout)
	defer cancel()
	go func() {
		// Ends when the drain does (cancel is deferred above).
		select {
		case <-a.force:
		case <-drainCtx.Done():
		}
		cancel()
	}()
	if err := w.Stop(drainCtx); err != nil {
		a.log.Warn().Err(err).Msg("drain cut short: runs still in flight were stopped and handed back to the stream")
	}
	return failure
}

// workerConfig is the worker's configuration from the command line's
// options o, the profiles read and the container runtime rt.
func (a workerCmds) workerConfig(nc *nats.Conn, o workerOptions, profiles profile.Profiles, rt jail.Runtime) worker.Config {
	log := a.log
	prov := worker.ProvisionConfig{
		AckWait:       o.ackWait,
		MaxDeliver:    o.maxDeliver,
		MaxAckPending: o.maxAckPending,
		Replicas:      o.replicas,
	}
	o.caps.apply(&prov)
	return worker.Config{
		ID:                  o.id,
		Pool:                o.pool,
		Concurrency:         o.concurrency,
		Profiles:            profiles,
		Runtime:             rt,
		Logger:              &log,
		Provision:           prov,
		OrphanGrace:         o.orphanGrace,
		WarmMax:             cmp.Or(o.warmMax, -1), // 0 on the command line keeps none
		WarmMaxIdle:         o.warmMaxIdle,
		ReconcileInterval:   o.reconcileInterval,
		BridgePath:          cmp.Or(o.bridge, a.bridgePath),
		StateDir:            o.stateDir,
		StateRoot:           o.stateRoot,
		WorkspaceTool:       a.workspaceTool(),
		Workspace:           o.workspace,
		Failpoint:           failpointFromEnv(),
		EgressProbePorts:    hostServicePorts(nc.ConnectedUrl(), o.metricsAddr),
		EgressCADir:         o.egressCADir,
		EgressUpstreamRoots: o.egressRoots,
		Prices:              o.priceTable,
	}
}

// waitForStop serves the worker until ctx ends (nil), SIGUSR2 asks it to
// stop leaving its runs to a successor (leave; docs/operations.md,
// "Upgrades") or the embedded nats-server fails (the error says why),
// reloading the profile file on each SIGHUP meanwhile.
func (a workerCmds) waitForStop(ctx context.Context, w *worker.Worker, o workerOptions, failed <-chan string) (failure error, leave bool) {
	// SIGHUP reloads the profile file (docs/operations.md, "Reloading
	// profiles").
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	defer signal.Stop(usr2)
	for {
		select {
		case <-ctx.Done():
			a.log.Info().Str("drain_timeout", o.drainTimeout.String()).Msg("stopping: letting runs in flight finish (interrupt again to cut short)")
			return nil, false
		case <-usr2:
			a.log.Info().Msg("SIGUSR2: stopping, leaving the runs in flight running for the next worker on this engine to adopt")
			return nil, true
		case reason := <-failed:
			failure := fmt.Errorf("nats-server: %s", reason)
			a.log.Error().Err(failure).Msg("stopping")
			return failure, false
		case <-hup:
			a.reloadProfiles(ctx, w, o.profiles)
		}
	}
}

// reloadProfiles reads the profile file at path again (SIGHUP) and
// hands it to w (worker.Worker.ReloadProfiles). A file that does not load
// or validate, or that the worker refuses, is logged at error and changes
// nothing: the profiles in use stay.
func (a workerCmds) reloadProfiles(ctx context.Context, w *worker.Worker, path string) {
	if path == "" {
		a.log.Warn().Msg("SIGHUP: no --profiles file to reload; the built-in profiles stay")
		return
	}
	ps, err := profile.LoadProfiles(path)
	if err == nil {
		var changed []string
		if changed, err = w.ReloadProfiles(ctx, ps); err == nil {
			a.log.Info().Str("file", path).Strs("profiles", ps.Names()).Strs("changed", changed).Msg("profiles reloaded")
			return
		}
	}
	a.log.Error().Err(err).Str("file", path).Msg("profile reload refused; the profiles in use stay")
}

// failpointFromEnv returns a worker failpoint for crash tests: when
// JETCREW_FAILPOINT names a crash point (the stage.Failpoint* constants of
// worker/stage), the process kills itself with SIGKILL on reaching it, as a
// crash would. Unset (production), it returns nil.
func failpointFromEnv() func(string) {
	want := os.Getenv("JETCREW_FAILPOINT")
	if want == "" {
		return nil
	}
	return func(name string) {
		if name == want {
			fmt.Fprintf(os.Stderr, "JETCREW_FAILPOINT=%s reached: killing the worker\n", name)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
}
