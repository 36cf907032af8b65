// Package warm keeps the worker's warm containers: for each profile that
// asks for them (profile.Profile.Warm), containers created and started with
// everything of the profile's jail and nothing of a run, each with a run
// directory of its own in which its launcher (the staged jetcrew binary,
// `launch --handoff`) waits on a hand-off socket. What a container mounts
// is the engine's to say (Config.Make): the pool knows no stage. A
// delivery claims one (Pool.Claim), the run's stages stage into its
// directory (which the run-directory stage moves to the run's path), and the
// engine hands the launcher the run (Container.Handoff): its command,
// environment and working directory, bound late, exactly as a cold
// container of the run would have them. One container serves one run and
// is removed after it, as a cold one is; the pool makes another in the
// background.
//
// The model is the warm pools of the sandbox systems jetcrew is compared
// with (Kubernetes agent-sandbox's SandboxWarmPool and SandboxClaim,
// OpenHands' warm servers): a container start, the whole of a cold run's
// start latency, moves out of the run's path.
package warm

import (
	"context"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/live"
	"github.com/jetcrew/jetcrew/worker/profile"
)

// Defaults of Config.
const (
	// DefaultMax is the most warm containers a worker keeps, all profiles
	// together, when Config.Max is zero (the worker's --warm-max).
	DefaultMax = 8
	// DefaultMaxIdle is how long a warm container waits for a run before
	// it is replaced (the worker's --warm-max-idle).
	DefaultMaxIdle = 30 * time.Minute
	// DefaultCheckEvery is how often the pool looks at its containers'
	// idle age and at their profiles' images.
	DefaultCheckEvery = 10 * time.Second
	// DefaultReadyTimeout bounds a new container's start, until its
	// launcher waits on its hand-off socket.
	DefaultReadyTimeout = time.Minute
	// DefaultProbeTimeout bounds the launcher's answer to the probe that
	// precedes every hand-off, when Config.ProbeTimeout is zero: a
	// launcher waiting answers within milliseconds; one paused or stopped
	// never does, and its run starts cold this long after.
	DefaultProbeTimeout = 500 * time.Millisecond
	// handoffTimeout bounds a hand-off: the launcher's acknowledgment.
	handoffTimeout = 10 * time.Second
)

// ImageLister is implemented by a jail.Runtime that can tell the engine's
// id of an image reference (the Docker runtime's ImageID); the pool uses
// it to replace the warm containers of a profile whose image was rebuilt.
// A Runtime without it keeps a warm container until its idle age.
type ImageLister interface {
	// ImageID returns the engine's id of the image ref.
	ImageID(ctx context.Context, ref string) (string, error)
}

// Config configures a Pool. Runtime, Profiles, Make and Registry are
// required.
type Config struct {
	// Runtime creates and removes the containers.
	Runtime jail.Runtime
	// Profiles are the worker's profiles in use, the set every part reads;
	// those with Warm > 0 get a pool. New plans the pools of the set as it
	// is then, Reload of the set as a reload stored it.
	Profiles *profile.Set
	// WorkerID and Install go on the containers' labels.
	WorkerID, Install string
	// Max is the most warm containers kept, all profiles together
	// (profiles in name order fill it); 0 means DefaultMax, negative none.
	Max int
	// MaxIdle replaces a container that waited this long; 0 means
	// DefaultMaxIdle.
	MaxIdle time.Duration
	// CheckEvery is how often idle ages and images are checked; 0 means
	// DefaultCheckEvery.
	CheckEvery time.Duration
	// ReadyTimeout bounds a container's start until its launcher waits; 0
	// means DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// ProbeTimeout bounds the launcher's answer to the probe before a
	// hand-off (Container.Handoff); 0 means DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// Make makes what one warm container mounts and its spec
	// (runner.Stages.MakeWarm): the engine's, written beside its list of
	// stages, so that a warm container has the jail a cold container of
	// the same profile would have.
	Make func(ctx context.Context, req MakeRequest) (Made, error)
	// Workspaces is set when Make makes containers for runs with a
	// workspace (profile.Profile.WarmWorkspace); unset, no profile keeps
	// any.
	Workspaces bool
	// Live is the worker's registry of what is live: the pool holds each
	// container it makes there, by name (live.ContainerKey), from before
	// its creation until a run took it over (Container.Handed) or it is
	// removed, and registers as live.Pool. Nil: a registry of the pool's
	// own.
	Live *live.Registry
	// Registry receives the pool's metrics; WorkerID and Pool label them.
	Registry prometheus.Registerer
	Pool     string
	Log      zerolog.Logger
}

func (c Config) withDefaults() Config {
	if c.Max == 0 {
		c.Max = DefaultMax
	}
	if c.MaxIdle == 0 {
		c.MaxIdle = DefaultMaxIdle
	}
	if c.CheckEvery == 0 {
		c.CheckEvery = DefaultCheckEvery
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = DefaultReadyTimeout
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = DefaultProbeTimeout
	}
	return c
}

// Pool keeps the warm containers of every profile that asks for them.
// Create it with New, run it with Start, end it with Stop. Safe for
// concurrent use.
type Pool struct {
	cfg Config
	m   metrics

	mu sync.Mutex
	// targets, names and kinds are the pools the profiles ask for (plan:
	// of Config.Profiles at New, then at each Reload).
	targets  map[string]int          // pool key (poolKey) → containers to keep
	names    []string                // pool keys with a target, profiles in name order
	kinds    map[string]poolOf       // pool key → its profile, its definition and kind
	ready    map[string][]*Container // by pool key, oldest first
	creating map[string]int          // by pool key
	failure  map[string]failure      // by pool key: the last failed creation
	stopped  bool

	wake   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// poolOf is what a pool key stands for: a profile's containers for runs
// without a workspace, or with one, and the profile's definition they are
// made with (the plan's).
type poolOf struct {
	profile   string
	workspace bool
	def       profile.Profile
}

// poolKey returns the key of profile name's pool of containers for runs
// with a workspace (workspace set) or without one.
func poolKey(name string, workspace bool) string {
	if workspace {
		return name + "\x00workspace"
	}
	return name
}

// failure is a pool's last failed creation and when to try again.
type failure struct {
	err   error
	at    time.Time
	retry time.Time
	b     *backoff.ExponentialBackOff
}

// New returns the pool of cfg's profiles; it creates nothing until Start.
func New(cfg Config) *Pool {
	cfg = cfg.withDefaults()
	if cfg.Live == nil {
		cfg.Live = &live.Registry{}
	}
	cfg.Live.Register(live.Pool)
	p := &Pool{
		cfg: cfg, ready: map[string][]*Container{}, creating: map[string]int{},
		failure: map[string]failure{}, wake: make(chan struct{}, 1),
	}
	p.targets, p.kinds, p.names = p.plan(cfg.Profiles.Load())
	p.m = newMetrics(cfg.Registry, cfg.WorkerID, cfg.Pool, p)
	return p
}

// plan returns the pools profiles ps ask for within Config.Max (profiles
// in name order, each one's pool for runs without a workspace first): each
// pool's target and kind by key, and the keys in that order.
func (p *Pool) plan(ps profile.Profiles) (targets map[string]int, kinds map[string]poolOf, names []string) {
	targets, kinds = map[string]int{}, map[string]poolOf{}
	budget := max(p.cfg.Max, 0)
	for _, name := range ps.Names() {
		prof := ps[name]
		for _, k := range []poolOf{{profile: name, def: prof}, {profile: name, workspace: true, def: prof}} {
			want := prof.Warm
			if k.workspace {
				want = prof.WarmWorkspace
				if !p.cfg.Workspaces {
					want = 0
				}
			}
			if n := min(want, budget); n > 0 {
				key := poolKey(name, k.workspace)
				targets[key], kinds[key] = n, k
				names = append(names, key)
				budget -= n
			}
		}
	}
	return targets, kinds, names
}

// Reload plans the pools again of the profiles Config.Profiles holds now
// (ps, a profile file reloaded and stored): the ready containers made with
// another value of a Fixed field than ps has now (FixedDiff), of a profile
// that is gone, or beyond what a pool keeps now are removed
// (replaced_total, reason "profile"), and the pools are refilled to ps's
// targets in the background; a container being made for a definition so
// changed is removed once made. A change of Late and Irrelevant fields
// alone keeps the pool: a run reads those from its own profile when it
// claims a container. Containers runs already claimed are theirs: a run
// keeps the profile it was admitted with.
func (p *Pool) Reload(ctx context.Context) {
	if p == nil {
		return
	}
	ps := p.cfg.Profiles.Load()
	p.mu.Lock()
	targets, kinds, names := p.plan(ps)
	var stale []*Container
	for key, cs := range p.ready {
		now, ok := ps[p.kinds[key].profile]
		var fresh []*Container
		for _, c := range cs {
			if ok && len(FixedDiff(&c.prof, &now)) == 0 {
				fresh = append(fresh, c)
			} else {
				stale = append(stale, c)
			}
		}
		// The most recently made are kept (Claim takes from the end).
		keep := min(len(fresh), targets[key])
		stale = append(stale, fresh[:len(fresh)-keep]...)
		p.ready[key] = fresh[len(fresh)-keep:]
	}
	for key := range p.failure {
		was := p.kinds[key].def
		if now, ok := ps[p.kinds[key].profile]; !ok || len(FixedDiff(&was, &now)) > 0 {
			delete(p.failure, key)
		}
	}
	p.targets, p.kinds, p.names = targets, kinds, names
	p.mu.Unlock()
	for _, c := range stale {
		p.m.replaced.WithLabelValues(c.profile, "profile").Inc()
		p.cfg.Log.Info().Str("profile", c.profile).Str("name", c.name).Msg("replacing a warm container: its profile was reloaded")
		c.remove(ctx)
	}
	p.poke()
}

// current reports whether a container made for profile prof (its
// definition then) in pool key still belongs to it: the pool still
// planned (its target not zero), its profile's Fixed fields unchanged
// since (FixedDiff). Called with mu held.
func (p *Pool) current(key string, prof *profile.Profile) bool {
	k, ok := p.kinds[key]
	return ok && p.targets[key] > 0 && len(FixedDiff(prof, &k.def)) == 0
}

// Enabled reports whether any profile keeps warm containers.
func (p *Pool) Enabled() bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.names) > 0
}

// Start starts the pool's background work, which runs until Stop. It
// fills every profile's pool, refills it after each claim, and replaces
// containers that died, idled past MaxIdle or run an image that changed
// (of ctx its values are kept, not its end). It runs even when no profile
// keeps warm containers: a reload may ask for some. It returns nil.
func (p *Pool) Start(ctx context.Context) error {
	if p == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel = cancel
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.run(ctx)
	}()
	return nil
}

// Stop ends the background work and removes every warm container the pool
// holds (ready or being made), with its directory. Claimed containers are
// their runs'. It returns nil.
func (p *Pool) Stop(ctx context.Context) error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	if p.cancel != nil {
		p.cancel()
	}
	p.wg.Wait()
	p.mu.Lock()
	var all []*Container
	for _, cs := range p.ready {
		all = append(all, cs...)
	}
	p.ready = map[string][]*Container{}
	p.mu.Unlock()
	for _, c := range all {
		c.remove(ctx)
	}
	return nil
}

// Owns reports whether the container named name is one the pool holds
// (being made, ready, or claimed and not yet handed off) in the registry
// of what is live (Config.Live), where the reconciler looks.
func (p *Pool) Owns(name string) bool {
	if p == nil {
		return false
	}
	return p.cfg.Live.HeldBy(live.Pool, live.ContainerKey+name)
}

// Status returns every profile's pools, by profile name (its pool for runs
// without a workspace first): its target, its ready containers (alive: one
// whose launcher or capture container died is not counted, though it waits
// in the list until a claim or a check removes it) and the last creation
// failure while it backs off.
func (p *Pool) Status() []messages.WarmPool {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.names) == 0 {
		return nil
	}
	out := make([]messages.WarmPool, 0, len(p.names))
	for _, key := range p.names {
		k := p.kinds[key]
		ready := 0
		for _, c := range p.ready[key] {
			if c.alive() { // one whose launcher or capture container died waits for no run
				ready++
			}
		}
		st := messages.WarmPool{Profile: k.profile, Workspace: k.workspace, Target: p.targets[key], Ready: ready}
		if f, ok := p.failure[key]; ok {
			st.Error = f.err.Error()
		}
		out = append(out, st)
	}
	return out
}

// poke wakes the background work (a refill).
func (p *Pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// run fills the pools and checks them every CheckEvery until ctx ends.
func (p *Pool) run(ctx context.Context) {
	tick := time.NewTicker(p.cfg.CheckEvery)
	defer tick.Stop()
	p.fill(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-tick.C:
			p.check(ctx)
		}
		p.fill(ctx)
	}
}

// fill makes the containers each pool lacks, one at a time, skipping a
// pool that is backing off after a failure.
func (p *Pool) fill(ctx context.Context) {
	for {
		key := p.next()
		if key == "" || ctx.Err() != nil {
			return
		}
		err := p.create(ctx, key)
		p.mu.Lock()
		p.creating[key]--
		if err != nil && ctx.Err() == nil {
			f, ok := p.failure[key]
			if !ok {
				f.b = backoff.NewExponentialBackOff()
				f.b.InitialInterval, f.b.MaxInterval, f.b.MaxElapsedTime = time.Second, time.Minute, 0
			}
			f.err, f.at = err, time.Now()
			f.retry = f.at.Add(f.b.NextBackOff())
			p.failure[key] = f
			kind := p.kinds[key]
			p.mu.Unlock()
			p.cfg.Log.Warn().Err(err).Str("profile", kind.profile).Bool("workspace", kind.workspace).
				Time("retry_at", f.retry).Msg("warm container could not be made; backing off")
			continue
		}
		if err == nil {
			delete(p.failure, key)
		}
		p.mu.Unlock()
	}
}

// next returns the key of the first pool (profiles by name) with fewer
// containers ready or being made than its target and not backing off,
// counting one more being made for it; "" when there is none.
func (p *Pool) next() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return ""
	}
	now := time.Now()
	for _, name := range p.names {
		if f, ok := p.failure[name]; ok && now.Before(f.retry) {
			continue
		}
		if len(p.ready[name])+p.creating[name] < p.targets[name] {
			p.creating[name]++
			return name
		}
	}
	return ""
}

// check replaces the containers that idled past MaxIdle, that died, or
// whose profile's image is now another (ImageLister).
func (p *Pool) check(ctx context.Context) {
	images := map[string]string{} // by pool key
	if il, ok := p.cfg.Runtime.(ImageLister); ok {
		p.mu.Lock()
		refs := map[string]string{}
		for _, key := range p.names {
			refs[key] = p.kinds[key].def.Image
		}
		p.mu.Unlock()
		for key, ref := range refs {
			if id, err := il.ImageID(ctx, ref); err == nil {
				images[key] = id
			}
		}
	}
	var stale []*Container
	reasons := map[*Container]string{}
	p.mu.Lock()
	for name, cs := range p.ready {
		keep := cs[:0]
		for _, c := range cs {
			switch {
			case !c.alive():
				reasons[c] = "exited"
			case time.Since(c.made) > p.cfg.MaxIdle:
				reasons[c] = "idle"
			case images[name] != "" && c.c.ImageID() != "" && images[name] != c.c.ImageID():
				reasons[c] = "image"
			default:
				keep = append(keep, c)
				continue
			}
			stale = append(stale, c)
		}
		p.ready[name] = keep
	}
	p.mu.Unlock()
	for _, c := range stale {
		p.m.replaced.WithLabelValues(c.profile, reasons[c]).Inc()
		p.cfg.Log.Info().Str("profile", c.profile).Str("name", c.name).Str("reason", reasons[c]).Msg("replacing a warm container")
		c.remove(ctx)
	}
}
