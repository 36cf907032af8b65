package warm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"time"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
)

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

// GaveBack counts a claimed container given back because the run could
// not have it (reason "mismatch": its jail is not the run's, or "exited":
// it died before its hand-off): the container is replaced, and the run,
// which then starts cold, is a miss.
func (p *Pool) GaveBack(c *Container, reason string) {
	p.m.replaced.WithLabelValues(c.profile, reason).Inc()
	p.m.missed.WithLabelValues(c.profile).Inc()
}
