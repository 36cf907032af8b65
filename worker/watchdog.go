package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/jetcrew/jetcrew/coordination"
)

// Why a watchdog stopped a run.
const (
	stopNone    = ""
	stopStalled = "stalled"
	stopBridge  = "bridge"
)

// setContainer records the run's started container, and stops it at once
// when a watchdog asked for that while it was starting.
func (r *run) setContainer(c Container) {
	r.stopMu.Lock()
	r.container = c
	kind := r.stopKind
	r.stopMu.Unlock()
	if kind != stopNone {
		r.stopContainer(c)
	}
}

// stopFor stops the run's container, once, for a watchdog reason: the first
// reason wins. Called before the container is known, the stop happens as
// soon as it is.
func (r *run) stopFor(kind, reason string) {
	r.stopMu.Lock()
	if r.stopKind != stopNone {
		r.stopMu.Unlock()
		return
	}
	r.stopKind, r.stopReason = kind, reason
	c := r.container
	r.stopMu.Unlock()
	r.log.Warn().Str("why", kind).Msg(reason)
	if c != nil {
		r.stopContainer(c)
	}
}

// stopContainer stops c in the background (see Worker.stopAsync).
func (r *run) stopContainer(c Container) {
	r.w.stopAsync(c, r.log, "stop container")
}

// stopped returns which watchdog stopped the run, and why.
func (r *run) stopped() (kind, reason string) {
	r.stopMu.Lock()
	defer r.stopMu.Unlock()
	return r.stopKind, r.stopReason
}

// watch runs the run's watchdogs until the returned function is called: the
// stall watchdog (no output and no coordination traffic for the profile's
// stall timeout) and, for agent CLIs with coordination on, the bridge
// deadline (the CLI must have started the jetcrew MCP server, proved by the
// bridge's first connection or by the CLI's own report, in time).
func (r *run) watch(prof Profile, needProof bool, cs *coordSession, prog *progress) func() {
	started := time.Now()
	return tickUntilStopped(watchInterval(prof), func() {
		if !r.state.BridgeConnected && cs.connected() {
			// Record it while the run lives, not only at its end. The run's
			// own goroutine is in Wait meanwhile, so this write is alone.
			ctx, cancel := context.WithTimeout(context.Background(), opMaxElapsed)
			if err := r.markBridgeConnected(ctx); err != nil {
				r.log.Warn().Err(err).Msg("record bridge connected")
			}
			cancel()
		}
		// How long past each bound the run is (≤ 0: not due). When a
		// late tick finds both due, the one that expired first names
		// the stop.
		stallOver := time.Duration(-1)
		if prof.stallTimeout > 0 {
			stallOver = prog.since() - prof.stallTimeout
		}
		bridgeOver := time.Duration(-1)
		if needProof && !r.mcpProved.Load() && !cs.connected() {
			bridgeOver = time.Since(started) - prof.bridgeDeadline
		}
		switch {
		case bridgeOver > 0 && bridgeOver >= stallOver:
			r.stopFor(stopBridge, fmt.Sprintf("the agent did not start the %s MCP server within %s (its bridge never connected)", coordination.MCPServerName, prof.bridgeDeadline))
		case stallOver > 0:
			r.stopFor(stopStalled, fmt.Sprintf("no progress (no output, no coordination traffic) for %s", prof.stallTimeout))
		}
	})
}

// watchInterval is how often the watchdogs look: a tenth of the shortest
// bound, between 50ms and 1s.
func watchInterval(p Profile) time.Duration {
	d := time.Second
	for _, b := range []time.Duration{p.stallTimeout, p.bridgeDeadline} {
		if b > 0 && b/10 < d {
			d = b / 10
		}
	}
	return max(d, 50*time.Millisecond)
}

// currentContainer returns the run's container, nil before it started.
func (r *run) currentContainer() Container {
	r.stopMu.Lock()
	defer r.stopMu.Unlock()
	return r.container
}
