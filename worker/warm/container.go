package warm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/live"
	"github.com/jetcrew/jetcrew/worker/profile"
)

// MakeRequest is what the pool asks of Config.Make for one container.
type MakeRequest struct {
	// Profile is the definition the container is made with.
	Profile *profile.Profile
	// Key is unique per container: it names the container's run
	// directory.
	Key string
	// Spec is the container's spec as the pool decides it: its name,
	// labels (jail.RoleWarm), hand-off command and environment. Make keeps
	// them and adds the jail and the mounts.
	Spec jail.ContainerSpec
	// Workspace is set for a container made for runs with a workspace.
	Workspace bool
	// Started is the pool's refill: a run that takes over the container's
	// workspace calls it once its agent started.
	Started func()
}

// Made is what Config.Make made for one container. On an error, Make
// leaves nothing made.
type Made struct {
	// Spec is the container's spec: the request's, with the jail and the
	// mounts a cold container of a run of the profile has.
	Spec jail.ContainerSpec
	// Dir is the host path of the container's run directory, mounted at
	// messages.ContainerRunDir: the pool opens the hand-off socket there.
	Dir string
	// Takeover is what the claiming run's stages take over beside the
	// directory (the engine's own type: the pool only keeps it); nil for
	// nothing.
	Takeover any
	// Alive reports whether what was made beside the container still
	// runs: the pool never hands out a container for which it does not.
	// Nil: always.
	Alive func() bool
	// Release gives up what Make made, once; with remove set it also
	// removes it (the container unused, removed first), except what a run
	// took over.
	Release func(remove bool)
}

// create makes one warm container of the pool key and waits until its
// launcher reached the hand-off socket; it is then ready.
func (p *Pool) create(ctx context.Context, pool string) error {
	p.mu.Lock()
	kind := p.kinds[pool]
	name, prof := kind.profile, kind.def
	p.mu.Unlock()
	var b [8]byte
	_, _ = rand.Read(b[:])
	key := "w" + hex.EncodeToString(b[:])
	c := &Container{pool: p, profile: name, prof: prof, key: pool, name: "jetcrew-warm-" + key[1:] + "-" + p.cfg.WorkerID,
		workspace: kind.workspace, died: make(chan struct{}), watchDone: make(chan struct{})}
	c.unhold = p.cfg.Live.Hold(live.Pool, live.ContainerKey+c.name)
	ok := false
	defer func() {
		if !ok {
			c.remove(context.WithoutCancel(ctx))
		}
	}()

	spec := jail.ContainerSpec{Name: c.name, Cmd: []string{messages.ContainerBridgePath, "launch", "--handoff", messages.ContainerHandoffPath},
		Env: []string{"HOME=" + prof.Home}, Labels: map[string]string{
			jail.LabelManaged: "true", jail.LabelWorker: p.cfg.WorkerID, jail.LabelInstall: p.cfg.Install,
			jail.LabelProfile: name, jail.LabelCreated: time.Now().UTC().Format(time.RFC3339Nano), jail.LabelRole: jail.RoleWarm,
		}}
	made, err := p.cfg.Make(ctx, MakeRequest{Profile: &prof, Key: key, Spec: spec, Workspace: kind.workspace, Started: p.poke})
	if err != nil {
		return err
	}
	c.parts, c.dir, c.spec = made, made.Dir, made.Spec
	if err := c.listen(c.dir); err != nil {
		return err
	}
	ctr, err := p.cfg.Runtime.Start(ctx, c.spec, c.output)
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
	if p.stopped || !p.current(pool, &prof) {
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
	// ln, not c.ln: the deadline may be set after this returns (stop does
	// not wait for a call already begun), when c.ln is nil.
	ln := c.ln
	stopDeadline := context.AfterFunc(actx, func() { _ = ln.SetDeadline(time.Unix(1, 0)) })
	conn, err := ln.AcceptUnix()
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
	// prof is the definition of the profile the container was made with:
	// a run of a definition with other Fixed fields never takes it.
	prof profile.Profile
	key  string // its pool's (poolKey)
	name string
	spec jail.ContainerSpec
	dir  string
	made time.Time

	c    jail.Container
	ln   *net.UnixListener // until the launcher connected
	sock string            // the hand-off socket ln listens on
	conn *net.UnixConn     // the launcher's hand-off connection
	// parts is what Config.Make made for the container; workspace is set
	// for one made for workspace runs.
	parts     Made
	workspace bool
	// unhold gives up the pool's hold of the container in the registry
	// of what is live (Config.Live).
	unhold func()

	// image is the claim's check of the container's image (checkImage),
	// set by Claim.
	image *imageCheck

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

// alive reports whether the container's launcher still waits and what
// was made beside it (Made.Alive) still runs.
func (c *Container) alive() bool {
	return c.launcherAlive() && (c.parts.Alive == nil || c.parts.Alive())
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
// claiming run's run-directory stage takes over (stage.Placement.Dir).
func (c *Container) Dir() string { return c.dir }

// Takeover returns what the claiming run's stages take over beside the
// run directory (Made.Takeover: the workspace of a container made for
// runs with one); nil for nothing.
func (c *Container) Takeover() any { return c.parts.Takeover }

// forget drops the container from the pool's holdings once its run owns
// it; what was made beside it is the run's (its stages took it over, and
// the run's bridge stage holds the bridge copy).
func (p *Pool) forget(c *Container) {
	c.unhold()
	c.gone.Do(func() {
		if c.parts.Release != nil {
			c.parts.Release(false)
		}
	})
}

// remove removes the container and what was made beside it (Made.Release):
// its directory, when it is still the container's (a run that claimed the
// container moved it), its hold on the bridge copy, its workspace unless a
// run took it over.
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
		if c.parts.Release != nil {
			c.parts.Release(true)
		}
		c.unhold()
	})
}
