package warm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"slices"
	"sort"
	"time"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
)

// Claim takes a ready warm container for one run of prof, one made for
// runs with a workspace when workspace is set: the most recently made that
// is alive and was made with prof's Fixed fields (FixedDiff: a run of
// another definition, admitted before or after a reload, never takes it);
// nil when the profile keeps none of that kind or none is ready (counted
// as missed). It starts the check that prof's image reference still names
// the container's image (ImageLister), which Verify waits for; for a
// container made for workspace runs, whose capture container runs the
// image too and which the run's stages take over, Claim waits for it
// itself. The caller verifies the container (Verify) and hands it the
// run (Handoff, counted as claimed once the launcher took it) or gives it
// back unused (GaveBack and Discard); either way the pool makes another.
func (p *Pool) Claim(prof *profile.Profile, workspace bool) *Container {
	if p == nil {
		return nil
	}
	key := poolKey(prof.Name, workspace)
	p.mu.Lock()
	if p.targets[key] == 0 {
		p.mu.Unlock()
		return nil
	}
	c, dead := p.take(key, prof)
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
	c.image = p.checkImage(c, prof.Image)
	if c.workspace {
		if err := c.image.wait(context.Background()); err != nil {
			p.cfg.Log.Info().Err(err).Str("profile", c.profile).Str("name", c.name).Msg("claimed warm container not used; the run starts cold")
			p.GaveBack(c, Reason(err))
			c.Discard(context.Background())
			return nil
		}
	}
	return c
}

// take takes out of pool key's ready containers, the most recently made
// first (the oldest age out), the first that is alive and was made with
// prof's Fixed fields, and the dead ones it passes (those whose launcher
// still waits, their workspace's capture container gone, for the caller
// to remove; the others remove themselves: watch). Called with mu held.
func (p *Pool) take(key string, prof *profile.Profile) (c *Container, dead []*Container) {
	cs := p.ready[key]
	for i := len(cs) - 1; i >= 0 && c == nil; i-- {
		x := cs[i]
		switch {
		case !x.alive():
			if x.launcherAlive() {
				dead = append(dead, x)
			}
			cs = slices.Delete(cs, i, i+1)
		case len(FixedDiff(&x.prof, prof)) == 0:
			c, cs = x, slices.Delete(cs, i, i+1)
		}
	}
	p.ready[key] = cs
	return c, dead
}

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

// Why a claimed container is not handed its run; Reason names each as a
// reason of replaced_total.
var (
	// ErrDied: the container's launcher no longer waits (the container
	// exited or was killed), before or during its hand-off.
	ErrDied = errors.New("warm container is no longer waiting")
	// ErrUnresponsive: the launcher did not answer the probe of its
	// hand-off within Config.ProbeTimeout (the container is paused, or
	// its launcher stopped).
	ErrUnresponsive = errors.New("warm container's launcher does not answer")
	// ErrImageChanged: the profile's image reference names another image
	// than the one the container was made from (rebuilt, re-tagged), or
	// the engine could not say which it names.
	ErrImageChanged = errors.New("warm container's image is no longer the profile's")
)

// Reason returns the reason of replaced_total (and GaveBack) for err, an
// error of Verify or Handoff: "image" (ErrImageChanged), "unresponsive"
// (ErrUnresponsive), "exited" (ErrDied), else "mismatch".
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrImageChanged):
		return "image"
	case errors.Is(err, ErrUnresponsive):
		return "unresponsive"
	case errors.Is(err, ErrDied):
		return "exited"
	}
	return "mismatch"
}

// Verify returns nil when the claimed container may take the run whose
// cold container would be spec: its jail is the run's (Matches) and its
// image the one the profile's image reference names since the claim (the
// claim's check, waited for here). An error says why not (Reason): the
// caller gives the container back (GaveBack, Discard) and starts the run
// cold, as a cold container is created from the reference as it is then.
func (c *Container) Verify(ctx context.Context, spec jail.ContainerSpec) error {
	if err := c.Matches(spec); err != nil {
		return err
	}
	return c.image.wait(ctx)
}

// imageCheck is the outcome of a claim's image check (checkImage): err,
// once done is closed.
type imageCheck struct {
	done chan struct{}
	err  error
}

// wait returns the check's outcome once it has one, or ctx's error; a nil
// check passes.
func (ic *imageCheck) wait(ctx context.Context) error {
	if ic == nil {
		return nil
	}
	select {
	case <-ic.done:
		return ic.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// checkImage starts checking that image reference ref still names the
// image c was made from (ImageLister: one image inspect, about a
// millisecond, beside the claiming run's staging). A changed image fails
// the check with ErrImageChanged and replaces the other ready containers
// of c's profile made from another image (imageChanged); so does an
// inspect that fails (the run then starts cold, and the engine's error is
// its). A Runtime that is no ImageLister, or a container whose image id
// the runtime did not say, passes.
func (p *Pool) checkImage(c *Container, ref string) *imageCheck {
	ic := &imageCheck{done: make(chan struct{})}
	il, ok := p.cfg.Runtime.(ImageLister)
	if !ok || c.c.ImageID() == "" {
		close(ic.done)
		return ic
	}
	go func() {
		defer close(ic.done)
		ctx, cancel := context.WithTimeout(context.Background(), handoffTimeout)
		defer cancel()
		id, err := il.ImageID(ctx, ref)
		switch {
		case err != nil:
			ic.err = fmt.Errorf("%w: inspect %s: %w", ErrImageChanged, ref, err)
		case id != c.c.ImageID():
			ic.err = fmt.Errorf("%w: %s is %s now, the container's image %s", ErrImageChanged, ref, id, c.c.ImageID())
			p.imageChanged(c.profile, id)
		}
	}()
	return ic
}

// imageChanged removes the ready containers of profile name (both its
// pools) made from another image than id, which its image reference now
// names (replaced_total, reason "image"), and refills the pools: a burst
// of runs after a rebuild finds at most one of them each, never the whole
// pool of the old image in turn.
func (p *Pool) imageChanged(name, id string) {
	var stale []*Container
	p.mu.Lock()
	for _, key := range []string{poolKey(name, false), poolKey(name, true)} {
		p.ready[key] = slices.DeleteFunc(p.ready[key], func(c *Container) bool {
			old := c.c.ImageID() != "" && c.c.ImageID() != id
			if old {
				stale = append(stale, c)
			}
			return old
		})
	}
	p.mu.Unlock()
	for _, c := range stale {
		p.m.replaced.WithLabelValues(c.profile, "image").Inc()
		p.cfg.Log.Info().Str("profile", c.profile).Str("name", c.name).Str("image_id", id).Msg("replacing a warm container: its profile's image changed")
		c.remove(context.Background())
	}
	p.poke()
}

// Handoff hands the container the run whose cold container would be spec:
// it first probes the launcher (probe: a paused container or a stopped
// launcher is never handed the run), then its launcher sets spec.Env over
// its environment, changes to spec.WorkingDir and executes spec.Cmd, its
// output going to output from then on. It returns the running container,
// now the run's (the caller removes it when the run ends, and calls
// Handed once its registry holds it), or an error (Reason) after which
// the caller gives it back (GaveBack, Discard) and starts the run cold.
func (c *Container) Handoff(ctx context.Context, spec jail.ContainerSpec, output jail.OutputFunc) (jail.Container, error) {
	// Take the connection from watch, then look again: it may have seen
	// the launcher go.
	_ = c.conn.SetReadDeadline(time.Unix(1, 0))
	<-c.watchDone
	if !c.alive() {
		return nil, ErrDied
	}
	rd := bufio.NewReader(c.conn)
	if err := c.probe(rd); err != nil {
		return nil, err
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
		return nil, fmt.Errorf("hand-off: %w", errors.Join(err, ErrDied))
	}
	ack, err := rd.ReadString('\n')
	if err != nil || ack != messages.HandoffAck {
		return nil, fmt.Errorf("hand-off: the launcher did not acknowledge (%q): %w", ack, errors.Join(err, ErrDied))
	}
	_ = c.conn.Close()
	// A warm start: a claim given back (a cancel, a mismatch, a dead
	// launcher) is none.
	c.pool.m.claimed.WithLabelValues(c.profile).Inc()
	return c.c, nil
}

// probe asks the launcher whether it still runs (messages.HandoffProbe)
// and waits up to Config.ProbeTimeout for its answer
// (messages.HandoffAlive), before anything of the run is written: a
// paused container (docker pause) or a stopped launcher (SIGSTOP) answers
// nothing, an error wrapping ErrUnresponsive, and the run, never handed
// to it, starts cold; a launcher gone is ErrDied.
func (c *Container) probe(rd *bufio.Reader) error {
	timeout := c.pool.cfg.ProbeTimeout
	_ = c.conn.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c.conn, messages.HandoffProbe); err != nil {
		return fmt.Errorf("probe: %w", errors.Join(err, ErrDied))
	}
	answer, err := rd.ReadString('\n')
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("probe: no answer within %s: %w", timeout, ErrUnresponsive)
	case err != nil:
		return fmt.Errorf("probe: %w", errors.Join(err, ErrDied))
	case answer != messages.HandoffAlive:
		return fmt.Errorf("probe: the launcher answered %q: %w", answer, ErrDied)
	}
	return nil
}

// Handed tells the pool the run that was handed the container now holds
// it (in its registry, where the reconciler looks): the pool lets it go,
// and refills now, the run's agent having started, unless the container
// was made for workspace runs: its workspace stage says when the agent
// started, after the in-jail unpack (MakeRequest.Started), so that the
// refill's container starts never compete with a run's start.
func (c *Container) Handed() {
	c.pool.forget(c)
	if !c.workspace {
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

// GaveBack counts a claimed container given back because the run could
// not have it, for reason (Reason: "mismatch", its jail is not the run's;
// "image", its image is no longer the profile's; "unresponsive", its
// launcher did not answer; "exited", it died before its hand-off): the
// container is replaced, and the run, which then starts cold, is a miss.
func (p *Pool) GaveBack(c *Container, reason string) {
	p.m.replaced.WithLabelValues(c.profile, reason).Inc()
	p.m.missed.WithLabelValues(c.profile).Inc()
}
