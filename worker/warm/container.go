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
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/stage/bridge"
	"github.com/jetcrew/jetcrew/worker/stage/rundir"
)

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
		died: make(chan struct{}), watchDone: make(chan struct{})}
	c.unhold = p.cfg.Live.Hold(live.Pool, live.ContainerKey+c.name)
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

	c          jail.Container
	ln         *net.UnixListener // until the launcher connected
	sock       string            // the hand-off socket ln listens on
	conn       *net.UnixConn     // the launcher's hand-off connection
	releaseDir func()
	releaseBin func()
	// unhold gives up the pool's hold of the container in the registry
	// of what is live (Config.Live).
	unhold func()
	// ws is the workspace of a container made for workspace runs, and
	// releaseWS gives it up (Config.Workspace).
	ws        *stage.WarmWorkspace
	releaseWS func(remove bool)

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

// forget drops the container from the pool's holdings once its run owns
// it; the run's directory is the run's, and so is the bridge copy (the
// run's bridge stage holds it).
func (p *Pool) forget(c *Container) {
	c.unhold()
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
		c.unhold()
	})
}
