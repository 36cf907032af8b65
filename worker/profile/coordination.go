package profile

import (
	"errors"
	"time"
)

// CoordinationConfig is the profile facet of a run's MCP coordination bridge.
//
// The run-directory, bridge and coordination stages read it; the bridge
// mounted as the launcher is what a warm container waits in, so a warm
// container is made with coordination (warm.Fixed) and takes the rest from
// its run.
type CoordinationConfig struct {
	// BridgeDeadline is how long a run's process (any backend, command
	// included) has to start the jetcrew MCP server (proved by the bridge's
	// first connection, or by Claude Code's init event) before the run is
	// stopped and ends failed; default 2m. A process that exits on its own
	// before that proof fails its run too, whatever its exit code. Both
	// apply while coordination is on and RequireBridge is not false.
	BridgeDeadline string `toml:"bridge_deadline" json:"bridge_deadline,omitempty"`
	// RequireBridge, when false, lets a run with coordination on go without
	// ever reaching its bridge: no bridge deadline, no failure for exiting
	// before it, and a run whose bridge never connected records
	// coordination "unused" in its state and its finished event. Default
	// true; the built-in shell profile sets false (/bin/sh is not an MCP
	// client), and so must any command profile whose process is not one.
	RequireBridge *bool `toml:"require_bridge" json:"require_bridge,omitempty"`
	// Coordination turns the run's MCP coordination bridge on (default) or
	// off. When on and the bridge cannot be staged, runs are refused.
	Coordination *bool `toml:"coordination" json:"coordination"`

	bridgeDeadline time.Duration
}

// defaultBridgeDeadline is how long a run has to reach its bridge by
// default (bridge_deadline).
const defaultBridgeDeadline = 2 * time.Minute

// resolve turns coordination on unless the profile turned it off, and
// parses the bridge deadline.
func (c *CoordinationConfig) resolve() error {
	if c.Coordination == nil {
		on := true
		c.Coordination = &on
	}
	var err error
	c.bridgeDeadline, err = parseDuration("bridge_deadline", c.BridgeDeadline, defaultBridgeDeadline)
	return err
}

// validate checks the bridge deadline is not negative.
func (c CoordinationConfig) validate() error {
	if c.bridgeDeadline < 0 {
		return errors.New("stall_timeout and bridge_deadline must not be negative")
	}
	return nil
}

// CoordinationOn reports whether runs of the profile get the coordination
// bridge.
func (c CoordinationConfig) CoordinationOn() bool { return c.Coordination == nil || *c.Coordination }

// BridgeRequired reports whether a run must reach its bridge in time.
// That is within BridgeDeadlineDuration, when coordination is on and
// RequireBridge is not false.
func (c CoordinationConfig) BridgeRequired() bool {
	return c.CoordinationOn() && (c.RequireBridge == nil || *c.RequireBridge)
}

// BridgeDeadlineDuration is how long a run has to reach its bridge.
// It bounds the start of the jetcrew MCP server when BridgeRequired (the
// bridge_deadline key; default 2 minutes).
func (c CoordinationConfig) BridgeDeadlineDuration() time.Duration { return c.bridgeDeadline }
