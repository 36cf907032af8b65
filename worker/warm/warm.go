// Package warm keeps the worker's warm containers: for each profile that
// asks for them (profile.Profile.Warm), containers created and started with
// everything of the profile's jail and nothing of a run, each with a run
// directory of its own in which its launcher (the staged jetcrew binary,
// `launch --handoff`) waits on a hand-off socket. A delivery claims one
// (Pool.Claim), the run's stages stage into its directory (which the
// run-directory stage moves to the run's path: stage.Run.WarmDir), and the
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
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/stage/bridge"
	"github.com/jetcrew/jetcrew/worker/stage/rundir"
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

// Config configures a Pool. Runtime, Profiles, Spec, Dirs, Bridges and
// Registry are required.
type Config struct {
	// Runtime creates and removes the containers.
	Runtime jail.Runtime
	// Profiles are the worker's profiles; those with Warm > 0 get a pool.
	Profiles profile.Profiles
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
	// Workspace, when set, makes the workspace of a container made for
	// runs with one (profile.Profile.WarmWorkspace; the workspace stage's
	// Trees.MakeWarm): spec is the container's, its name and labels set
	// (what the workspace makes beside it, its capture container, takes
	// its jail from it). The container is created with ww's mounts;
	// release gives up what it holds, removing what it made when remove
	// is set. Nil: no profile keeps containers for workspace runs.
	Workspace func(ctx context.Context, spec jail.ContainerSpec, prof *profile.Profile) (ww *stage.WarmWorkspace, release func(remove bool), err error)
	// Spec returns the part of a container's spec the profile alone
	// decides (runner.ProfileSpec): the warm container's jail, which a
	// run's spec must match to be handed it.
	Spec func(*profile.Profile) jail.ContainerSpec
	// Dirs makes the containers' run directories; Bridges stages the
	// bridge binary their launcher is.
	Dirs    *rundir.Dirs
	Bridges *bridge.Bridges
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
	return c
}

// Pool keeps the warm containers of every profile that asks for them.
// Create it with New, run it with Start, end it with Stop. Safe for
// concurrent use.
type Pool struct {
	cfg Config
	m   metrics

	mu sync.Mutex
	// profiles are the worker's profiles (Config.Profiles, then Reload's);
	// targets, names and kinds the pools they ask for (plan).
	profiles profile.Profiles
	targets  map[string]int          // pool key (poolKey) → containers to keep
	names    []string                // pool keys with a target, profiles in name order
	kinds    map[string]poolOf       // pool key → its profile and kind
	ready    map[string][]*Container // by pool key, oldest first
	creating map[string]int          // by pool key
	owned    map[string]*Container   // by container name: every container the pool has not handed off or removed
	failure  map[string]failure      // by pool key: the last failed creation
	stopped  bool

	wake   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// poolOf is what a pool key stands for: a profile's containers for runs
// without a workspace, or with one.
type poolOf struct {
	profile   string
	workspace bool
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
	p := &Pool{
		cfg: cfg, ready: map[string][]*Container{}, creating: map[string]int{},
		owned: map[string]*Container{}, failure: map[string]failure{}, wake: make(chan struct{}, 1),
	}
	p.profiles = cfg.Profiles
	p.targets, p.kinds, p.names = p.plan(cfg.Profiles)
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
		for _, k := range []poolOf{{name, false}, {name, true}} {
			want := prof.Warm
			if k.workspace {
				want = prof.WarmWorkspace
				if p.cfg.Workspace == nil {
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

// Reload replaces the worker's profiles with ps (a profile file reloaded):
// the ready containers of a profile whose definition changed
// (profile.Profile.Digest), that is gone or whose pool keeps fewer now are
// removed (replaced_total, reason "profile"), and the pools are refilled
// to ps's targets in the background; a container being made for a changed
// profile is removed once made. Containers runs already claimed are
// theirs: a run keeps the profile it was admitted with.
func (p *Pool) Reload(ctx context.Context, ps profile.Profiles) {
	if p == nil {
		return
	}
	p.mu.Lock()
	targets, kinds, names := p.plan(ps)
	same := func(name string) bool {
		np, ok := ps[name]
		return ok && np.Digest() == p.profiles[name].Digest()
	}
	var stale []*Container
	for key, cs := range p.ready {
		keep := 0
		if same(p.kinds[key].profile) {
			keep = min(len(cs), targets[key])
		}
		// The most recently made are kept (Claim takes from the end).
		stale = append(stale, cs[:len(cs)-keep]...)
		p.ready[key] = cs[len(cs)-keep:]
	}
	for key := range p.failure {
		if !same(p.kinds[key].profile) {
			delete(p.failure, key)
		}
	}
	p.profiles, p.targets, p.kinds, p.names = ps, targets, kinds, names
	p.mu.Unlock()
	for _, c := range stale {
		p.m.replaced.WithLabelValues(c.profile, "profile").Inc()
		p.cfg.Log.Info().Str("profile", c.profile).Str("name", c.name).Msg("replacing a warm container: its profile was reloaded")
		c.remove(ctx)
	}
	p.poke()
}

// current reports whether a container made for profile prof (its
// definition then) in pool key still belongs to it: the profile unchanged
// since and the pool's target not zero. Called with mu held.
func (p *Pool) current(key string, prof profile.Profile) bool {
	now, ok := p.profiles[prof.Name]
	return ok && p.targets[key] > 0 && now.Digest() == prof.Digest()
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

// Start starts the pool's background work: it fills every profile's pool,
// refills it after each claim, and replaces containers that died, idled
// past MaxIdle or run an image that changed, until Stop. It runs even
// when no profile keeps warm containers: a reload may ask for some.
func (p *Pool) Start() {
	if p == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.run(ctx)
	}()
}

// Stop ends the background work and removes every warm container the pool
// holds (ready or being made), with its directory. Claimed containers are
// their runs'.
func (p *Pool) Stop(ctx context.Context) {
	if p == nil {
		return
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
}

// Owns reports whether the container named name is one the pool holds
// (being made, ready, or claimed and not yet handed off): the reconciler
// spares it.
func (p *Pool) Owns(name string) bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.owned[name]
	return ok
}

// ContainerIDs returns the ids of the started containers the pool holds.
func (p *Pool) ContainerIDs() []string {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := make([]string, 0, len(p.owned))
	for _, c := range p.owned {
		if c.c != nil {
			ids = append(ids, c.c.ID())
		}
	}
	return ids
}

// Status returns every profile's pools, by profile name (its pool for runs
// without a workspace first): its target, its ready containers and the
// last creation failure while it backs off.
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
		st := messages.WarmPool{Profile: k.profile, Workspace: k.workspace, Target: p.targets[key], Ready: len(p.ready[key])}
		if f, ok := p.failure[key]; ok {
			st.Error = f.err.Error()
		}
		out = append(out, st)
	}
	return out
}

// Claim takes a ready warm container of prof for one run, one made for
// runs with a workspace when workspace is set: nil when the profile keeps
// none of that kind or none is ready (counted as missed). The caller
// hands it the run (Handoff, counted as claimed once the launcher took
// it) or gives it back unused (Discard); either way the pool makes
// another.
func (p *Pool) Claim(prof *profile.Profile, workspace bool) *Container {
	key := poolKey(prof.Name, workspace)
	if p == nil {
		return nil
	}
	p.mu.Lock()
	if p.targets[key] == 0 {
		p.mu.Unlock()
		return nil
	}
	var c *Container
	var dead []*Container
	for cs := p.ready[key]; len(cs) > 0; cs = p.ready[key] {
		// The most recently made first: the oldest age out.
		c, p.ready[key] = cs[len(cs)-1], cs[:len(cs)-1]
		if c.alive() {
			break
		}
		if c.launcherAlive() {
			dead = append(dead, c) // its workspace's capture container exited
		}
		c = nil
	}
	p.mu.Unlock()
	for _, d := range dead {
		p.m.replaced.WithLabelValues(d.profile, "exited").Inc()
		go d.remove(context.Background())
	}
	if c == nil {
		p.poke()
		p.m.missed.WithLabelValues(prof.Name).Inc()
		return nil
	}
	// The refill begins once the run is handed the container or gives it
	// back (Handed, GaveBack, Discard): a claim never waits for it, and it
	// does not compete with the claiming run's staging for the engine.
	c.claimed.Store(true)
	return c
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
			refs[key] = p.profiles[p.kinds[key].profile].Image
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

// create makes one warm container of the pool key and waits until its
// launcher reached the hand-off socket; it is then ready.
func (p *Pool) create(ctx context.Context, pool string) error {
	p.mu.Lock()
	kind := p.kinds[pool]
	name := kind.profile
	prof := p.profiles[name]
	p.mu.Unlock()
	var b [8]byte
	_, _ = rand.Read(b[:])
	key := "w" + hex.EncodeToString(b[:])
	c := &Container{pool: p, profile: name, key: pool, name: "jetcrew-warm-" + key[1:] + "-" + p.cfg.WorkerID,
		died: make(chan struct{}), watchDone: make(chan struct{})}
	p.mu.Lock()
	p.owned[c.name] = c
	p.mu.Unlock()
	ok := false
	defer func() {
		if !ok {
			c.remove(context.WithoutCancel(ctx))
		}
	}()

	dir, release, err := p.cfg.Dirs.Warm(key)
	if err != nil {
		return err
	}
	c.dir, c.releaseDir = dir, release
	binPath, digest, err := p.cfg.Bridges.Stage()
	if err != nil {
		return err
	}
	c.releaseBin = p.cfg.Bridges.Hold(digest)
	if err := c.listen(dir); err != nil {
		return err
	}

	spec := p.cfg.Spec(&prof)
	spec.Name = c.name
	spec.Cmd = []string{messages.ContainerBridgePath, "launch", "--handoff", messages.ContainerHandoffPath}
	spec.Env = []string{"HOME=" + prof.Home}
	spec.Labels = map[string]string{
		jail.LabelManaged: "true", jail.LabelWorker: p.cfg.WorkerID, jail.LabelInstall: p.cfg.Install,
		jail.LabelProfile: name, jail.LabelCreated: time.Now().UTC().Format(time.RFC3339Nano), jail.LabelRole: jail.RoleWarm,
	}
	spec.Mounts = []jail.Mount{rundir.Mount(dir, profile.Plan{}).Mount, bridge.Mount(binPath, digest).Mount}
	if kind.workspace {
		if err := p.makeWorkspace(ctx, c, &spec, &prof); err != nil {
			return err
		}
	}
	c.spec = spec
	ctr, err := p.cfg.Runtime.Start(ctx, spec, c.output)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	p.mu.Lock()
	c.c = ctr
	p.mu.Unlock()

	if err := c.awaitLauncher(ctx, p.cfg.ReadyTimeout); err != nil {
		return err
	}
	c.made = time.Now()
	go c.watch()

	p.mu.Lock()
	if p.stopped || !p.current(pool, prof) {
		// Stopped, or the profile was reloaded meanwhile.
		p.mu.Unlock()
		return nil // ok stays false: removed
	}
	p.ready[pool] = append(p.ready[pool], c)
	p.mu.Unlock()
	ok = true
	p.cfg.Log.Debug().Str("profile", name).Bool("workspace", kind.workspace).Str("name", c.name).Msg("warm container ready")
	return nil
}

// makeWorkspace makes the workspace of c, a container made for workspace
// runs (Config.Workspace), and adds its mounts to spec. The pool refills
// once the claiming run's agent started, after its in-jail unpack
// (stage.WarmWorkspace.Started, Handed).
func (p *Pool) makeWorkspace(ctx context.Context, c *Container, spec *jail.ContainerSpec, prof *profile.Profile) error {
	ww, release, err := p.cfg.Workspace(ctx, *spec, prof)
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	c.ws, c.releaseWS = ww, release
	ww.Started = p.poke
	spec.Mounts = append(spec.Mounts, ww.Mounts...)
	return nil
}

// listen opens the container's hand-off socket in its run directory dir,
// where its launcher (`launch --handoff`) connects once it runs.
func (c *Container) listen(dir string) error {
	sock := filepath.Join(dir, messages.HandoffName)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return fmt.Errorf("hand-off socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	c.ln, c.sock = ln, sock
	if err := os.Chmod(sock, coordination.SocketMode); err != nil {
		return fmt.Errorf("hand-off socket: %w", err)
	}
	return nil
}

// awaitLauncher waits up to timeout for the launcher to connect to the
// hand-off socket; one connection is all it takes, and the socket goes.
func (c *Container) awaitLauncher(ctx context.Context, timeout time.Duration) error {
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stopDeadline := context.AfterFunc(actx, func() { _ = c.ln.SetDeadline(time.Unix(1, 0)) })
	conn, err := c.ln.AcceptUnix()
	stopDeadline()
	if err != nil {
		return fmt.Errorf("its launcher did not reach the hand-off socket within %s: %w", timeout, err)
	}
	_ = c.ln.Close()
	_ = os.Remove(c.sock)
	c.ln, c.conn = nil, conn
	return nil
}

// Container is one warm container, from its creation to its hand-off (or
// removal).
type Container struct {
	pool    *Pool
	profile string
	key     string // its pool's (poolKey)
	name    string
	spec    jail.ContainerSpec
	dir     string
	made    time.Time

	c          jail.Container
	ln         *net.UnixListener // until the launcher connected
	sock       string            // the hand-off socket ln listens on
	conn       *net.UnixConn     // the launcher's hand-off connection
	releaseDir func()
	releaseBin func()
	// ws is the workspace of a container made for workspace runs, and
	// releaseWS gives it up (Config.Workspace).
	ws        *stage.WarmWorkspace
	releaseWS func(remove bool)

	// out is where the container's output goes: nothing until its run's
	// hand-off, then the run's.
	out     atomic.Pointer[jail.OutputFunc]
	claimed atomic.Bool
	// died is closed when the launcher's connection ended before a
	// hand-off (the container exited or was killed); watchDone when watch
	// returned.
	died      chan struct{}
	diedOnce  sync.Once
	watchDone chan struct{}
	gone      sync.Once
}

// output passes the container's output to its run once handed off; what
// it writes before (a launcher's error) is logged.
func (c *Container) output(stream string, b []byte) {
	if f := c.out.Load(); f != nil {
		(*f)(stream, b)
		return
	}
	c.pool.cfg.Log.Warn().Str("name", c.name).Str("stream", stream).Bytes("output", b).Msg("warm container wrote before its hand-off")
}

// alive reports whether the launcher still waits.
// alive reports whether the container's launcher still waits and what
// was made with its workspace (stage.WarmWorkspace.Alive) still runs.
func (c *Container) alive() bool {
	return c.launcherAlive() && (c.ws == nil || c.ws.Alive == nil || c.ws.Alive())
}

// launcherAlive reports whether the container's launcher still waits.
func (c *Container) launcherAlive() bool {
	select {
	case <-c.died:
		return false
	default:
		return true
	}
}

// watch waits until the launcher's connection ends before a hand-off (the
// container died: it is then replaced, unless a run claimed it, which then
// finds it dead) or a hand-off interrupts it (a read deadline in the past).
func (c *Container) watch() {
	defer close(c.watchDone)
	var b [1]byte
	_, err := c.conn.Read(b[:]) // the launcher never writes before its hand-off
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && c.claimed.Load() {
		return // a hand-off takes the connection
	}
	c.diedOnce.Do(func() { close(c.died) })
	if c.claimed.Load() {
		return
	}
	c.pool.m.replaced.WithLabelValues(c.profile, "exited").Inc()
	c.pool.cfg.Log.Warn().Str("profile", c.profile).Str("name", c.name).Msg("warm container died while waiting; replacing it")
	c.pool.mu.Lock()
	c.pool.ready[c.key] = slices.DeleteFunc(c.pool.ready[c.key], func(x *Container) bool { return x == c })
	c.pool.mu.Unlock()
	c.remove(context.Background())
	c.pool.poke()
}

// Name returns the container's name.
func (c *Container) Name() string { return c.name }

// ContainerID returns the Docker container id of the warm container. A
// warm container carries no run id label, so a claiming run records this
// id in its state before the hand-off: a delivery after a crash finds the
// container by it.
func (c *Container) ContainerID() string { return c.c.ID() }

// Dir returns the host path of the container's run directory, which the
// claiming run's run-directory stage takes over (stage.Run.WarmDir).
func (c *Container) Dir() string { return c.dir }

// Workspace returns the workspace of a container made for runs with one,
// which the claiming run's workspace stage takes over
// (stage.Run.WarmWorkspace); nil for one made for runs without.
func (c *Container) Workspace() *stage.WarmWorkspace { return c.ws }

// Matches returns nil when spec, a run's container spec as a cold start
// would create it, has the jail of this container: every field but the
// ones a hand-off binds late (name, command, environment, working
// directory, labels) and the run directory's host path. An error says what
// differs: the run must not have this container.
func (c *Container) Matches(spec jail.ContainerSpec) error {
	a, b := jailOf(c.spec), jailOf(spec)
	if reflect.DeepEqual(a, b) {
		return nil
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return fmt.Errorf("warm container %s has another jail than the run's: %s, the run's %s", c.name, ja, jb)
}

// jailOf returns spec without what a hand-off binds late, its mounts
// sorted by target.
func jailOf(spec jail.ContainerSpec) jail.ContainerSpec {
	spec.Name, spec.Cmd, spec.Env, spec.WorkingDir, spec.Labels = "", nil, nil, "", nil
	spec.Mounts = slices.Clone(spec.Mounts)
	for i, m := range spec.Mounts {
		if m.Target == messages.ContainerRunDir {
			spec.Mounts[i].Source = ""
		}
	}
	sort.Slice(spec.Mounts, func(i, j int) bool { return spec.Mounts[i].Target < spec.Mounts[j].Target })
	return spec
}

// ErrDied is returned by Handoff when the container is no longer waiting.
var ErrDied = errors.New("warm container is no longer waiting")

// Handoff hands the container the run whose cold container would be spec:
// its launcher sets spec.Env over its environment, changes to
// spec.WorkingDir and executes spec.Cmd, its output going to output from
// then on. It returns the running container, now the run's (the caller
// removes it when the run ends, and calls Handed once its registry holds
// it), or an error after which the caller Discards it.
func (c *Container) Handoff(ctx context.Context, spec jail.ContainerSpec, output jail.OutputFunc) (jail.Container, error) {
	// Take the connection from watch, then look again: it may have seen
	// the launcher go.
	_ = c.conn.SetReadDeadline(time.Unix(1, 0))
	<-c.watchDone
	if !c.alive() {
		return nil, ErrDied
	}
	data, err := json.Marshal(messages.Handoff{Argv: spec.Cmd, Env: spec.Env, Dir: spec.WorkingDir})
	if err != nil {
		return nil, err
	}
	c.out.Store(&output)
	deadline := time.Now().Add(handoffTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.conn.SetDeadline(deadline)
	if _, err := c.conn.Write(append(data, '\n')); err != nil {
		return nil, fmt.Errorf("hand-off: %w", err)
	}
	ack, err := bufio.NewReader(c.conn).ReadString('\n')
	if err != nil || ack != messages.HandoffAck {
		return nil, fmt.Errorf("hand-off: the launcher did not acknowledge (%q): %w", ack, errors.Join(err, ErrDied))
	}
	_ = c.conn.Close()
	// A warm start: a claim given back (a cancel, a mismatch, a dead
	// launcher) is none.
	c.pool.m.claimed.WithLabelValues(c.profile).Inc()
	return c.c, nil
}

// Handed tells the pool the run that was handed the container now holds
// it (in its registry, where the reconciler looks): the pool lets it go,
// and refills now, the run's agent having started, unless the container
// was made for workspace runs: its workspace stage says when the agent
// started, after the in-jail unpack (stage.WarmWorkspace.Started), so that
// the refill's container starts never compete with a run's start.
func (c *Container) Handed() {
	c.pool.forget(c)
	if c.ws == nil {
		c.pool.poke()
	}
}

// Discard gives the container back unused, after a claim whose run could
// not have it (or no longer needs it): it is removed, with its directory
// unless the run took that over (the run removes its own).
func (c *Container) Discard(ctx context.Context) {
	c.remove(ctx)
	c.pool.poke()
}

// forget drops the container from the pool's holdings once its run owns
// it; the run's directory is the run's, and so is the bridge copy (the
// run's bridge stage holds it).
func (p *Pool) forget(c *Container) {
	p.mu.Lock()
	delete(p.owned, c.name)
	p.mu.Unlock()
	c.gone.Do(func() {
		if c.releaseDir != nil {
			c.releaseDir()
		}
		if c.releaseBin != nil {
			c.releaseBin()
		}
		if c.releaseWS != nil {
			c.releaseWS(false)
		}
	})
}

// remove removes the container and what it holds: its directory, when it
// is still the container's (a run that claimed the container moved it),
// its hold on the bridge copy.
func (c *Container) remove(ctx context.Context) {
	c.gone.Do(func() {
		p := c.pool
		if c.ln != nil {
			_ = c.ln.Close()
		}
		if c.conn != nil {
			c.claimed.Store(true) // watch ends quietly
			_ = c.conn.Close()
		}
		if c.c != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			if err := p.cfg.Runtime.Remove(rctx, c.c.ID()); err != nil {
				p.cfg.Log.Warn().Err(err).Str("name", c.name).Msg("remove warm container; the reconciler will")
			}
			cancel()
		}
		if c.dir != "" {
			if err := os.RemoveAll(c.dir); err != nil {
				p.cfg.Log.Warn().Err(err).Str("dir", c.dir).Msg("remove warm container's directory")
			}
		}
		if c.releaseDir != nil {
			c.releaseDir()
		}
		if c.releaseBin != nil {
			c.releaseBin()
		}
		if c.releaseWS != nil {
			// The volume and directory are the run's once it took them
			// (its workspace stage removes them with the run).
			c.releaseWS(!c.ws.Taken())
		}
		p.mu.Lock()
		delete(p.owned, c.name)
		p.mu.Unlock()
	})
}

// metrics are the pool's Prometheus metrics.
type metrics struct {
	claimed  *prometheus.CounterVec
	missed   *prometheus.CounterVec
	replaced *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, workerID, pool string, p *Pool) metrics {
	labels := prometheus.Labels{"worker": workerID, "pool": pool}
	counter := func(name, help string, by ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "jetcrew", Subsystem: "warm", Name: name, Help: help, ConstLabels: labels}, by)
	}
	m := metrics{
		claimed:  counter("claimed_total", "Runs that started in a warm container, by profile.", "profile"),
		missed:   counter("missed_total", "Runs of a profile that keeps warm containers that started cold: none was ready, or the one claimed could not have the run (GaveBack), by profile.", "profile"),
		replaced: counter("replaced_total", "Warm containers removed unused and replaced, by profile and reason (exited, idle, image, mismatch, profile).", "profile", "reason"),
	}
	ready := readyCollector{p: p, desc: prometheus.NewDesc("jetcrew_warm_ready", "Warm containers ready now, by profile.", []string{"profile"}, labels)}
	reg.MustRegister(m.claimed, m.missed, m.replaced, ready)
	return m
}

// readyCollector reports each profile's ready warm containers at scrape
// time.
type readyCollector struct {
	p    *Pool
	desc *prometheus.Desc
}

func (r readyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- r.desc }

func (r readyCollector) Collect(ch chan<- prometheus.Metric) {
	var names []string
	ready := map[string]int{} // by profile: both its pools
	for _, st := range r.p.Status() {
		if _, ok := ready[st.Profile]; !ok {
			names = append(names, st.Profile)
		}
		ready[st.Profile] += st.Ready
	}
	for _, name := range names {
		ch <- prometheus.MustNewConstMetric(r.desc, prometheus.GaugeValue, float64(ready[name]), name)
	}
}

// GaveBack counts a claimed container given back because the run could
// not have it (reason "mismatch": its jail is not the run's, or "exited":
// it died before its hand-off): the container is replaced, and the run,
// which then starts cold, is a miss.
func (p *Pool) GaveBack(c *Container, reason string) {
	p.m.replaced.WithLabelValues(c.profile, reason).Inc()
	p.m.missed.WithLabelValues(c.profile).Inc()
}
