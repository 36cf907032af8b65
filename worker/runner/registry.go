package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/live"
	"github.com/jetcrew/jetcrew/worker/stage/proxy"
)

// registry is the engine's index of the runs this worker holds, by run id:
// cancels, stops and coordination events find a run here. A delivery is in
// it from before it claims its run (handle) until its outcome is recorded,
// and while it is, the run and its container are held in the worker's
// registry of what is live (Config.Live: live.RunKey, live.ContainerKey),
// where the reconciler looks.
type registry struct {
	mu   sync.Mutex
	runs map[string]*entry
	held *live.Registry
}

// entry is a live run and its container (nil while being created), and
// the holds that say so in the registry of what is live.
type entry struct {
	run       *run
	container jail.Container
	release   []func()
}

// unhold gives up the entry's holds.
func (a *entry) unhold() {
	for _, release := range a.release {
		release()
	}
}

// newer reports whether a is a later delivery of the same request than b,
// or a later request for the same run id.
func newer(a, b *run) bool {
	as, bs := a.meta.Sequence.Stream, b.meta.Sequence.Stream
	return as > bs || as == bs && a.meta.NumDelivered > b.meta.NumDelivered
}

// track records r, with its container c (nil while being created), as the
// run's live attempt on this worker, unless a newer attempt of the run is
// already tracked: cancels and stops go to the newest.
func (g *registry) track(r *run, c jail.Container) {
	g.mu.Lock()
	defer g.mu.Unlock()
	a := g.runs[r.req.ID]
	if a != nil && a.run != r && r.adoptedFrom == "" && (newer(a.run, r) || a.run.adoptedFrom != "") {
		// An adopted run is never superseded, and supersedes a
		// delivery of its request: that one leaves the run to it
		// (leaveToHolder).
		return
	}
	owner := live.Run(r.req.ID)
	n := &entry{run: r, container: c, release: []func(){g.held.Hold(owner, live.RunKey+r.req.ID)}}
	if c != nil {
		n.release = append(n.release, g.held.Hold(owner, live.ContainerKey+c.ID()))
	}
	g.runs[r.req.ID] = n
	if a != nil {
		a.unhold() // after n holds: the run is held throughout
	}
}

// untrack removes r, only if it is r that is tracked: an attempt winding
// down never untracks the one that superseded it.
func (g *registry) untrack(r *run) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if a := g.runs[r.req.ID]; a != nil && a.run == r {
		delete(g.runs, r.req.ID)
		a.unhold()
	}
}

// get returns the live run of id, nil when this worker holds none.
func (g *registry) get(id string) *run {
	g.mu.Lock()
	defer g.mu.Unlock()
	if a := g.runs[id]; a != nil {
		return a.run
	}
	return nil
}

// Holds reports whether this worker holds run id live: it started the
// run's container, or adopted the run. A delivery of its request being
// decided (tracked before it claims) does not hold it.
func (e *Runner) Holds(id string) bool {
	r := e.live.get(id)
	return r != nil && holdsContainer(r)
}

// HeldLive reports whether a live worker, this one or another, holds run
// id (Holds here, else the answer to messages.SubjectHoldPrefix).
func (e *Runner) HeldLive(id string) bool { return e.Holds(id) || e.askHolder(id, 2*time.Second) }

// askHolder asks the worker holding run id whether it holds it live
// (messages.SubjectHoldPrefix); false when none answers within wait.
func (e *Runner) askHolder(id string, wait time.Duration) bool {
	_, err := e.cfg.NC.Request(messages.SubjectHoldPrefix+"."+id, nil, wait)
	return err == nil
}

// OnCoordEvent records a coordination step on the run's event subject
// jetcrew.events.<run_id>.coord (a core publish, captured by the events
// stream, so a slow server never blocks the bridge), counts it, and counts
// as the run's progress. The coordination host calls it.
func (e *Runner) OnCoordEvent(ev coordination.Event) {
	b, err := json.Marshal(ev)
	if err != nil {
		return
	}
	m := nats.NewMsg(messages.SubjectEvents(ev.RunID, messages.EventCoord))
	m.Data = b
	m.Header.Set(messages.HeaderRunID, ev.RunID)
	if err := e.cfg.NC.PublishMsg(m); err != nil {
		e.log.Warn().Err(err).Str("run_id", ev.RunID).Msg("publish coordination event")
	}
	if r := e.live.get(ev.RunID); r != nil && r.sr != nil {
		r.sr.Progress.Touch()
	}
	switch ev.Kind {
	case coordination.EventSent:
		e.cfg.Metrics.coordMsgs.WithLabelValues("sent").Inc()
	case coordination.EventRead:
		e.cfg.Metrics.coordMsgs.WithLabelValues("read").Add(float64(len(ev.MessageIDs)))
	}
}

// KillEgress cuts the egress proxy of run runID as a crash would: its
// listener and every open connection; its supervisor reopens it after the
// worker's egress restart delay, the run's connections failing meanwhile.
// It reports whether the run is live here with an egress proxy. For drills
// and tests.
func (e *Runner) KillEgress(runID string) bool {
	r := e.live.get(runID)
	if r == nil {
		return false
	}
	for _, s := range r.stages {
		if p, ok := s.(*proxy.Stage); ok {
			return p.Kill()
		}
	}
	return false
}

// RemoveRunContainers removes every container of runID in this
// installation, whoever created it (earlier deliveries' containers: the
// caller's delivery has none yet): those labelled with the run's id, and
// the one its record names (recorded, a container id of this installation;
// a warm container a run claimed carries no run id), then the run's
// workspace volumes no live run of this worker holds.
func (e *Runner) RemoveRunContainers(ctx context.Context, runID, recorded string) error {
	rt := e.cfg.Runtime
	cs, err := rt.ListManaged(ctx)
	if err != nil {
		return err
	}
	for _, c := range cs {
		if c.Labels[jail.LabelRunID] != runID && (recorded == "" || c.ID != recorded) || c.Labels[jail.LabelInstall] != e.cfg.Install {
			continue
		}
		e.log.Info().Str("container_id", shortID(c.ID)).Str("name", c.Name).Str("run_id", runID).
			Msg("removing an earlier delivery's container")
		if err := rt.Remove(ctx, c.ID); err != nil {
			return fmt.Errorf("remove %s: %w", c.Name, err)
		}
	}
	vs, err := rt.ListManagedVolumes(ctx)
	if err != nil {
		return err
	}
	for _, v := range vs {
		if v.Labels[jail.LabelRunID] != runID || v.Labels[jail.LabelInstall] != e.cfg.Install || e.cfg.Stages.Trees.VolumeHeld(v.Name) {
			continue
		}
		e.log.Info().Str("volume", v.Name).Str("run_id", runID).Msg("removing an earlier delivery's volume")
		if err := rt.RemoveVolume(ctx, v.Name); err != nil {
			return fmt.Errorf("remove volume %s: %w", v.Name, err)
		}
	}
	return nil
}

// shortID returns the first 12 characters of a container id.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
