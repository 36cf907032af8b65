// Package proxy is the stage that gives a run of a profile with an egress
// allowlist its egress proxy: the worker's end of the run's only way out
// (network none; the launcher's relay joins 127.0.0.1:3128 in the
// container to the proxy's socket in the run's directory). It also holds
// the worker's egress machinery: the proxy configuration, the
// installation's egress CA for egress_inject, and the start-up proof that
// the jail reaches its proxy and nothing else.
package proxy

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// Config configures a worker's Proxies.
type Config struct {
	// WorkerID and Pool label the egress metric; WorkerID and Install the
	// proof container.
	WorkerID, Pool, Install string
	// Profiles are the worker's profiles: the proof and the CA are made
	// at Start, only when one has an egress allowlist (egress_inject).
	Profiles *profile.Set
	// NC publishes each egress attempt on jetcrew.events.<run_id>.egress.
	NC *nats.Conn
	// Registry receives jetcrew_egress_attempts_total{result}.
	Registry prometheus.Registerer
	// Resolver resolves the names runs ask for; nil means
	// net.DefaultResolver.
	Resolver egress.Resolver
	// UpstreamRoots verifies the real hosts' certificates on the proxy's
	// own TLS connections for egress_inject hosts; nil means the system's.
	UpstreamRoots *x509.CertPool
	// RestartDelay is how long a run's proxy stays down after its
	// listener failed before it is reopened.
	RestartDelay time.Duration
	// CADir keeps the installation's egress CA; "" means <user config
	// dir>/jetcrew/egress-ca/<Install>.
	CADir string
	// LookupEnv reads the worker's environment for egress_inject values.
	LookupEnv func(string) (string, bool)
	// Proof configures the start-up proof.
	Proof ProofConfig
	// Prices prices the model usage the proxies meter (the worker's
	// --prices file); nil prices nothing: only tokens are counted.
	Prices *usage.Prices
	// RateWait bounds how long a model request waits for its key's rate
	// (egress_rate) before it is answered 429; 0 means DefaultRateWait,
	// negative no wait at all.
	RateWait time.Duration
	// Log receives the machinery's logs.
	Log zerolog.Logger
}

// Proxies is one worker's egress machinery. Create it with New; Start
// starts the proof, Stop ends it.
type Proxies struct {
	cfg     Config
	budgets *budgetStore
	ecfg    egress.Config
	metrics *usageMetrics
	// caPEM is the egress CA's certificate, for profiles with
	// egress_inject; nil when none has. caDir is its directory.
	caPEM []byte
	caDir string
	// proved is closed when the proof has an outcome; err is its failure.
	proved chan struct{}
	err    error
	once   sync.Once
	// cancel ends the proof, wg waits for it (Stop).
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns the Proxies of a worker configured by cfg, registering its
// metric. It does no I/O.
func New(cfg Config) *Proxies {
	attempts := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "jetcrew",
		ConstLabels: prometheus.Labels{"worker": cfg.WorkerID, "pool": cfg.Pool},
		Name:        "egress_attempts_total", Help: "Connection attempts of runs through their egress proxy, by result (allowed, refused)."},
		[]string{"result"})
	cfg.Registry.MustRegister(attempts)
	p := &Proxies{cfg: cfg, proved: make(chan struct{}), metrics: newUsageMetrics(cfg)}
	if cfg.NC != nil {
		js, _ := jetstream.New(cfg.NC) // fails only for a nil connection
		p.budgets = &budgetStore{js: js}
	}
	observe := func(allowed bool) {
		if allowed {
			attempts.WithLabelValues("allowed").Inc()
		} else {
			attempts.WithLabelValues("refused").Inc()
		}
	}
	p.ecfg = egress.Config{Resolver: cfg.Resolver, Logger: cfg.Log, Publish: p.publish, Observe: observe,
		RestartDelay: cfg.RestartDelay, UpstreamRoots: cfg.UpstreamRoots}
	return p
}

// rateWait is Config.RateWait with its default.
func (p *Proxies) rateWait() time.Duration {
	switch {
	case p.cfg.RateWait == 0:
		return DefaultRateWait
	case p.cfg.RateWait < 0:
		return 0
	}
	return p.cfg.RateWait
}

// needed reports whether any profile has an egress allowlist.
func (p *Proxies) needed() bool {
	for _, prof := range p.cfg.Profiles.Load() {
		if prof.HasEgress() {
			return true
		}
	}
	return false
}

// Start loads the egress CA and starts the start-up proof in the
// background. It does so only when a profile has an allowlist; otherwise
// runs need no proof. Runs of egress profiles wait for the proof's
// outcome; Stop ends it (of ctx its values are kept, not its end). It
// returns nil: a failed proof or CA refuses those runs, not the worker's
// start.
func (p *Proxies) Start(ctx context.Context) error {
	if !p.needed() {
		p.settle(nil)
		return nil
	}
	if err := p.loadCA(); err != nil {
		p.cfg.Log.Error().Err(err).Msg("egress CA: runs of profiles with an egress allowlist are refused")
		p.settle(err)
		return nil
	}
	ctx, p.cancel = context.WithCancel(context.WithoutCancel(ctx))
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		err := p.prove(ctx)
		if err != nil {
			p.cfg.Log.Error().Err(err).Msg("egress proof failed: runs of profiles with an egress allowlist are refused")
		} else {
			p.cfg.Log.Info().Msg("egress proof passed: the jail reaches its proxy and nothing else")
		}
		p.settle(err)
	}()
	return nil
}

// Stop ends the start-up proof when it still runs and waits for it. It
// returns nil.
func (p *Proxies) Stop(context.Context) error {
	if p.cancel != nil {
		p.cancel()
	}
	p.wg.Wait()
	return nil
}

func (p *Proxies) settle(err error) {
	p.once.Do(func() { p.err = err; close(p.proved) })
}

// Ready reports whether the start-up proof passed (or none is needed).
func (p *Proxies) Ready() bool {
	select {
	case <-p.proved:
		return p.err == nil
	default:
		return false
	}
}

// awaitProof waits for the start-up proof and returns its failure.
func (p *Proxies) awaitProof(ctx context.Context) error {
	select {
	case <-p.proved:
	case <-ctx.Done():
		return ctx.Err()
	}
	if p.err != nil {
		return fmt.Errorf("egress refused: the worker's egress proof failed, so no run of an egress profile runs here: %w", p.err)
	}
	return nil
}

// publish publishes an egress attempt on jetcrew.events.<run_id>.egress: a
// core publish, captured by the events stream, so a slow server never
// holds up the proxy.
func (p *Proxies) publish(ev messages.EgressEvent) {
	b, err := json.Marshal(ev)
	if err != nil {
		return
	}
	m := nats.NewMsg(messages.SubjectEvents(ev.RunID, messages.EventEgress))
	m.Data = b
	m.Header.Set(messages.HeaderRunID, ev.RunID)
	if err := p.cfg.NC.PublishMsg(m); err != nil {
		p.cfg.Log.Warn().Err(err).Str("run_id", ev.RunID).Msg("publish egress event")
	}
}

// For returns the stage of one run whose profile has an egress allowlist.
func (p *Proxies) For(*stage.Run) *Stage { return &Stage{p: p} }

// Stage is one run's egress proxy.
type Stage struct {
	p    *Proxies
	sess *egress.Session
	// metered is true when the proxy meters a host (the profile has
	// egress_inject); budgets are the run's, for its receipt.
	metered bool
	budgets *messages.ReceiptBudgets
	profile string
	// seen is the usage last written to the record (Check); sh the run's
	// shared budgets (nil: none).
	seen messages.UsageTotals
	// failed is the count of upstream failures last written (Check).
	failed int64
	sh     *sharedBudgets
	run    *stage.Run
	// pmu guards the pause (on_budget = "pause") and the grant applied.
	pmu         sync.Mutex
	pausedSince time.Time
	grant       messages.BudgetSpend
	wasPaused   bool
	// reachedBefore is the budget an adopted run's record says it
	// reached before the adoption ("": none).
	reachedBefore string
}

// The hooks Stage implements, declared so that a signature drifting from
// the contract fails to build (worker/runner's TestStageHooksImplemented
// holds this list to exactly the hooks implemented).
var (
	_ stage.Prestarter = (*Stage)(nil)
	_ stage.Adopter    = (*Stage)(nil)
	_ stage.Checker    = (*Stage)(nil)
	_ stage.Exiter     = (*Stage)(nil)
	_ stage.Noter      = (*Stage)(nil)
	_ stage.Releaser   = (*Stage)(nil)
)

// Name returns "egress".
func (s *Stage) Name() string { return "egress" }

// Prestart opens the run's egress proxy on the socket in its directory,
// once the worker's proof passed, with the profile's header injections
// (their values from the worker's environment; the CA staged beside the
// socket), and points the container's HTTP clients at the relay
// (profile.ProxyEnv, and profile.ProxyTrustEnv with injections). A proof
// that failed, or an injected variable that is not set, fails the run.
func (s *Stage) Prestart(ctx context.Context, req *stage.PrestartRequest, resp *stage.PrestartResponse) error {
	if req.Dir == nil {
		return fmt.Errorf("egress needs the run's directory")
	}
	req.Dir.Taint() // the socket and the CA staged there: never pooled
	if err := s.p.awaitProof(ctx); err != nil {
		return err
	}
	prof := req.Run.Profile
	inj, err := s.p.injections(prof)
	if err != nil {
		return err
	}
	if len(inj) > 0 {
		if err := s.p.stageCA(req.Dir.Path()); err != nil {
			return err
		}
	}
	if err := s.open(ctx, req.Run, req.Dir.Path(), inj, nil); err != nil {
		return err
	}
	resp.Env = append(resp.Env, Env(prof)...)
	return nil
}

// open opens the run's egress session on the socket in dir with the
// profile's policy and injections inj: metered when inj has any, with the
// profile's egress_ask, going on from carried when set (an adopted run).
// Everything is in place before the socket serves its first connection.
func (s *Stage) open(ctx context.Context, run *stage.Run, dir string, inj []egress.Injection, carried *egress.Carried) error {
	prof := run.Profile
	sess, err := egress.New(s.p.ecfg, run.ID(), prof.EgressPolicy(), filepath.Join(dir, profile.EgressSocketName), inj...)
	if err != nil {
		return err
	}
	s.sess = sess
	if carried != nil {
		sess.Carry(*carried)
	}
	if len(inj) > 0 {
		s.meter(run, inj)
		if carried != nil && s.budgets != nil && s.p.budgets != nil {
			// The grants the run had (cumulative) raise its limits
			// before its first request here, as they did there.
			s.granted(ctx, run)
		}
	}
	if len(prof.EgressAsk) > 0 {
		asks, approvals, err := s.p.askBuckets(ctx)
		if err != nil {
			return fmt.Errorf("egress_ask: %w", err)
		}
		a := &asker{p: s.p, run: run, asks: asks, approvals: approvals}
		sess.AskFor(prof.EgressAskPolicy(), a.ask)
	}
	return sess.Serve()
}

// Env is what a run of profile p gets in its environment for its egress
// proxy: profile.ProxyEnv, and profile.ProxyTrustEnv when the profile has
// injections (the container then trusts the egress CA).
func Env(p *profile.Profile) []string {
	env := profile.ProxyEnv()
	if len(p.EgressInject) > 0 {
		env = append(env, profile.ProxyTrustEnv()...)
	}
	return env
}

// Note records the run's egress totals (so far, while it runs) and, when
// its proxy meters a host, its model usage and the budget it reached: once
// the run is final, its proxy is closed (the container has ended) and the
// totals are its last.
func (s *Stage) Note(st *messages.RunState) {
	if s.sess == nil {
		return
	}
	t := s.sess.Totals() // so far; Check has the record written when upstream failures grow
	if st.State.Final() {
		t = s.sess.Close()
	}
	st.Egress = &t
	if !s.metered {
		return
	}
	u := s.sess.Usage()
	st.Usage = &u
	s.noteBudget(st)
	if st.Receipt != nil {
		st.Receipt.Prices = pricesDigest(s.p.cfg.Prices)
		st.Receipt.Budgets = s.budgets
		st.Receipt.EgressUnmeteredPaths = s.run.Profile.EgressUnmeteredPaths
	}
}

// Release stops the run's proxy: its listener and every open connection
// are cut and its socket removed (its directory stays). The requests in
// flight are settled before it returns: each counted in the run's totals
// and in its shared budgets (charged its reservation under a cost or
// token budget, its answer having been cut). For a run left to a
// successor (stage.ReleaseRequest.Leave) that is all this worker holds:
// the engine writes the record again after the releases, so the totals
// the successor goes on from (Adopt) hold those requests too.
func (s *Stage) Release(*stage.ReleaseRequest) {
	if s.sess != nil {
		s.sess.Close()
	}
}

// Kill cuts the run's proxy as a crash would: its listener and every open
// connection; its supervisor reopens it after Config.RestartDelay. It
// reports whether the run has a proxy. For drills and tests.
func (s *Stage) Kill() bool {
	if s.sess == nil {
		return false
	}
	s.sess.Kill()
	return true
}
