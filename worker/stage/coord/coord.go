// Package coord is the stage that gives a run its coordination: the
// session of the run's bridge socket in its directory (the MCP bridge's
// peers, messages and inbox, on NATS), the run's presence in its group,
// and the bridge deadline: a run whose agent must start the jetcrew MCP
// server and does not in time is stopped and fails, and one whose agent
// exits before it did fails too, whatever its exit code.
package coord

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// Values of messages.RunState.Coordination this stage records ("off" is
// the engine's, for a run without coordination).
const (
	// Available: the run's bridge socket is served.
	Available = "available"
	// Unavailable: the socket could not be served (NATS trouble); the run
	// goes on, its agent told so on every tool call.
	Unavailable = "unavailable"
	// Unused: the profile let the run go without its bridge, and it did.
	Unused = "unused"
)

// Coord serves the coordination sessions of one worker's runs through its
// coordination host.
type Coord struct {
	host *coordination.Host
}

// New returns the Coord serving sessions through host.
func New(host *coordination.Host) *Coord { return &Coord{host: host} }

// For returns the stage of one run.
func (c *Coord) For(run *stage.Run) *Stage {
	s := &Stage{c: c, required: run.Profile.BridgeRequired()}
	if s.required {
		s.deadline = run.Profile.BridgeDeadlineDuration()
	}
	return s
}

// Stage is one run's coordination.
type Stage struct {
	c *Coord
	// required: the agent must reach its bridge within deadline.
	required bool
	deadline time.Duration
	dir      stage.Dir
	sess     *coordination.Session
	status   string
	// started is when the bridge deadline's clock started (Poststart).
	started time.Time
	// proved is set when the agent CLI reported the jetcrew MCP server
	// connected.
	proved atomic.Bool
	// recorded is set once the bridge's connection was recorded while the
	// run lived; exited once the container exited.
	recorded, exited atomic.Bool
}

// The hooks Stage implements, declared so that a signature drifting from
// the contract fails to build (worker/runner's TestStageHooksImplemented
// holds this list to exactly the hooks implemented).
var (
	_ stage.Prestarter  = (*Stage)(nil)
	_ stage.Poststarter = (*Stage)(nil)
	_ stage.Adopter     = (*Stage)(nil)
	_ stage.Checker     = (*Stage)(nil)
	_ stage.MCPObserver = (*Stage)(nil)
	_ stage.Exiter      = (*Stage)(nil)
	_ stage.Noter       = (*Stage)(nil)
	_ stage.Releaser    = (*Stage)(nil)
)

// Name returns "coordination".
func (s *Stage) Name() string { return "coordination" }

// Prestart serves the run's bridge socket in its directory: the socket a
// pooled directory kept bound, else a new bind. A socket that cannot be
// served (NATS trouble) is recorded as coordination "unavailable" and the
// run goes on. It sets JETCREW_MCP_CONFIG and lists mcp.json (the run
// directory stage's) in the receipt's files.
func (s *Stage) Prestart(ctx context.Context, req *stage.PrestartRequest, resp *stage.PrestartResponse) error {
	if req.Dir == nil {
		return errors.New("coordination needs the run's directory")
	}
	s.dir = req.Dir
	run := req.Run
	g := run.Request.GroupRef()
	info := coordination.RunInfo{RunID: run.ID(), Pool: g.Pool, Group: g.Name, Profile: run.Request.Profile}
	path := filepath.Join(s.dir.Path(), messages.SocketName)
	var err error
	switch k := s.dir.Kept().(type) {
	case nil:
	case *coordination.Socket:
		if s.sess, err = s.c.host.ServeSocket(ctx, info, path, k); err != nil {
			run.Log.Debug().Err(err).Msg("kept coordination socket not served; binding a new one")
		}
	default:
		_ = k.Close() // not a socket this stage kept
	}
	if s.sess == nil {
		s.sess, err = s.c.host.Serve(ctx, info, path)
	}
	if err != nil {
		run.Log.Warn().Err(err).Msg("coordination unavailable for this run")
		s.status = Unavailable
	} else {
		s.status = Available
		// The launcher takes steers into the CLI's input (launch --steer).
		s.sess.SetSteerInput(run.Plan.SteerInput != "")
		// An ask waits at most until shortly before the run's timeout: a
		// deadline from now, a little early, until Poststart knows when
		// the container started (the agent may ask before that).
		if run.Timeout > 0 {
			s.sess.SetDeadline(time.Now().Add(run.Timeout))
		}
	}
	resp.Env = append(resp.Env, Env()...)
	resp.Files = append(resp.Files, File())
	return nil
}

// Adopt serves the adopted run's bridge socket again at the path its
// container mounts (the dead worker's socket there is stale: replaced),
// in the group the run is in, and resumes the bridge deadline and the
// asks' deadline from the run's start as recorded. A bridge the record
// says connected needs no proof again; the bridge inside reconnects on
// its own (coordination/relay). A socket that cannot be served makes the
// run go on with coordination "unavailable", as at a start.
func (s *Stage) Adopt(ctx context.Context, req *stage.AdoptRequest, _ *stage.PrestartResponse) error {
	if req.Dir == nil {
		return errors.New("coordination needs the run's directory")
	}
	s.dir = req.Dir
	run := req.Run
	g := run.Request.GroupRef()
	info := coordination.RunInfo{RunID: run.ID(), Pool: g.Pool, Group: g.Name, Profile: run.Request.Profile,
		State: messages.StateRunning, StartedAt: req.State.StartedAt, Adopted: true}
	s.started = req.State.StartedAt
	if req.State.BridgeConnected {
		s.proved.Store(true)
		s.recorded.Store(true)
	}
	var err error
	if s.sess, err = s.c.host.Serve(ctx, info, filepath.Join(s.dir.Path(), messages.SocketName)); err != nil {
		run.Log.Warn().Err(err).Msg("coordination unavailable for this adopted run")
		s.status = Unavailable
		return nil
	}
	s.status = Available
	s.sess.SetSteerInput(run.Plan.SteerInput != "")
	if run.Timeout > 0 {
		s.sess.SetDeadline(s.started.Add(run.Timeout))
	}
	if err := s.sess.SetState(ctx, messages.StateRunning); err != nil {
		run.Log.Warn().Err(err).Msg("coordination presence")
	}
	return nil
}

// File is the receipt's entry for the run's mcp.json, which the agent's
// MCP client reads: its path in the container and its mode.
func File() messages.ReceiptFile {
	return messages.ReceiptFile{Path: messages.ContainerMCPConfigPath, Mode: fmt.Sprintf("%04o", messages.MCPConfigMode)}
}

// Env is what coordination adds to a run's environment:
// JETCREW_MCP_CONFIG, the path of its mcp.json.
func Env() []string { return []string{"JETCREW_MCP_CONFIG=" + messages.ContainerMCPConfigPath} }

// Poststart records the run running in its group's presence (a failure is
// logged; the presence refresher retries) and starts the bridge deadline.
func (s *Stage) Poststart(ctx context.Context, req *stage.PoststartRequest) error {
	s.started = time.Now()
	if s.sess != nil {
		// An ask waits at most until shortly before the run's timeout
		// (an ask made before this keeps Prestart's earlier deadline).
		if req.Run.Timeout > 0 {
			s.sess.SetDeadline(s.started.Add(req.Run.Timeout))
		}
		if err := s.sess.SetState(ctx, messages.StateRunning); err != nil {
			req.Run.Log.Warn().Err(err).Msg("coordination presence")
		}
	}
	return nil
}

// connected reports whether the run's bridge has reached its socket.
func (s *Stage) connected() bool { return s.sess != nil && s.sess.Connected() }

// CheckEvery is a tenth of the bridge deadline, between 50ms and 1s (1s
// without one: the bridge's connection is still recorded while the run
// lives).
func (s *Stage) CheckEvery() time.Duration {
	if s.deadline <= 0 {
		return time.Second
	}
	return min(time.Second, max(50*time.Millisecond, s.deadline/10))
}

// unproven reports whether the run is held to its bridge and has not
// reached it: the profile requires the bridge, the worker serves the run's
// socket (one it could not serve is the worker's trouble, not the agent's:
// the run goes on, coordination "unavailable"), and neither has the bridge
// connected nor has the agent CLI reported the MCP server connected.
func (s *Stage) unproven() bool {
	return s.required && s.status == Available && !s.connected() && !s.proved.Load()
}

// Check records the bridge's first connection while the run lives (changed
// is then true), and stops a run whose agent has not reached its bridge
// (unproven) within the bridge deadline (the run fails).
func (s *Stage) Check(now time.Time) (*stage.Stop, bool) {
	if s.connected() {
		return nil, !s.recorded.Swap(true)
	}
	if !s.unproven() {
		return nil, false
	}
	if over := now.Sub(s.started) - s.deadline; over > 0 {
		return &stage.Stop{State: messages.StateFailed, Overdue: over,
			Reason: fmt.Sprintf("the agent did not start the %s MCP server within %s (its bridge never connected)", messages.MCPServerName, s.deadline)}, false
	}
	return nil, false
}

// MCPStatus takes the agent CLI's report of the jetcrew MCP server's
// status: connected proves the bridge; anything else stops the run, which
// would otherwise work without coordination.
func (s *Stage) MCPStatus(status string) *stage.Stop {
	if status != "connected" {
		return &stage.Stop{State: messages.StateFailed,
			Reason: fmt.Sprintf("the agent CLI reports MCP server %s as %q: it would work without coordination", messages.MCPServerName, status)}
	}
	s.proved.Store(true)
	return nil
}

// Exited notes that the container exited, for Note's "unused", and holds
// a run that ends now to its bridge: a process that exited on its own
// before its bridge connected (unproven) fails the run, whatever its exit
// code, with ExitedBeforeBridge's reason. A run that was stopped keeps its
// outcome (the bridge deadline's stop included), and so does one whose
// agent never ran (req.NotRun: its workspace never unpacked). A profile with
// require_bridge = false is never held.
func (s *Stage) Exited(_ context.Context, req *stage.ExitedRequest, resp *stage.ExitedResponse) {
	s.exited.Store(true)
	if !req.Final || req.Stopped || req.NotRun || !s.unproven() {
		return
	}
	exit := req.Reason
	if req.State == messages.StateSucceeded {
		exit = "exit code 0"
	}
	resp.Fail, resp.Reason = true, ExitedBeforeBridge(exit)
}

// ExitedBeforeBridge is the reason of a run whose agent exited before it
// reached its bridge; exit says how it exited ("exit code 0", or the
// reason the exit alone would have given).
func ExitedBeforeBridge(exit string) string {
	return fmt.Sprintf("the agent exited before it started the %s MCP server (its bridge never connected; a profile whose command is no MCP client sets require_bridge = false): %s",
		messages.MCPServerName, exit)
}

// Note records the run's coordination and whether its bridge connected.
func (s *Stage) Note(st *messages.RunState) {
	st.Coordination = s.status
	st.BridgeConnected = st.BridgeConnected || s.connected()
	if s.exited.Load() && s.status == Available && !st.BridgeConnected && !s.required {
		st.Coordination = Unused
	}
}

// Release ends the session: a finished run leaves its group and its inbox
// is deleted; a run handed back keeps both (detach), and a run left to a
// successor its open questions too (leave). When the run is final
// and its container gone, the socket stays bound and goes back to the
// directory for the pool; a session that did not end cleanly keeps the
// directory out of the pool.
func (s *Stage) Release(req *stage.ReleaseRequest) {
	if s.sess == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	switch {
	case req.Final && req.ContainerGone:
		var k *coordination.Socket
		if k, err = s.sess.CloseKeepSocket(ctx); err == nil && k != nil {
			s.dir.Keep(k)
		}
	case req.Final:
		err = s.sess.Close(ctx)
	case req.Leave:
		err = s.sess.Leave(ctx) // its questions stay open for the adopter
	default:
		err = s.sess.Detach(ctx)
	}
	if err != nil {
		s.dir.Taint() // it may have left its socket
		if !errors.Is(err, context.Canceled) {
			req.Run.Log.Warn().Err(err).Msg("end coordination session")
		}
	}
}
