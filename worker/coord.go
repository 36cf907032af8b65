package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
)

// runDir returns the host directory staged for run id: StateDir/r/<16 hex
// digits of the id's SHA-256>, short enough for a unix socket path.
func (w *Worker) runDir(runID string) string {
	sum := sha256.Sum256([]byte(runID))
	return filepath.Join(w.cfg.StateDir, "r", hex.EncodeToString(sum[:8]))
}

// coordSession is a run's coordination: its staged directory and, when the
// socket could be served, its session.
type coordSession struct {
	dir  string
	sess *coordination.Session
}

// stageCoordination prepares a run's bridge: the read-only bridge binary
// must exist, the run directory with mcp.json is staged and its socket
// served. A bridge that cannot be staged refuses the run (an error); a
// socket that cannot be served (NATS trouble) is recorded as coordination
// "unavailable" and the run goes on, its agent told so on every tool call.
func (r *run) stageCoordination(ctx context.Context) (*coordSession, error) {
	w := r.w
	fi, err := os.Stat(w.cfg.BridgePath)
	if err != nil {
		return nil, fmt.Errorf("coordination bridge cannot be staged: %w (build it with `make build`, or set the worker's bridge path; or turn coordination off in the profile)", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o555 != 0o555 {
		return nil, fmt.Errorf("coordination bridge cannot be staged: %s must be a regular file with mode 0555 or wider (has %s)", w.cfg.BridgePath, fi.Mode())
	}
	dir := w.runDir(r.req.ID)
	if err := coordination.StageRunDir(dir); err != nil {
		return nil, fmt.Errorf("coordination run directory cannot be staged: %w", err)
	}
	cs := &coordSession{dir: dir}
	sess, err := w.coord.Serve(ctx, coordination.RunInfo{RunID: r.req.ID, Group: r.req.GroupOrID(), Profile: r.req.Profile},
		filepath.Join(dir, coordination.SocketName))
	if err != nil {
		r.log.Warn().Err(err).Msg("coordination unavailable for this run")
		r.state.Coordination = "unavailable"
		return cs, nil
	}
	cs.sess = sess
	r.state.Coordination = "available"
	return cs, nil
}

// end ends a run's coordination: a finished run leaves its group and its
// inbox is deleted; a run handed back keeps both (detach). The run
// directory is removed either way.
func (cs *coordSession) end(r *run, final bool) {
	if cs == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if cs.sess != nil {
		r.state.BridgeConnected = r.state.BridgeConnected || cs.sess.Connected()
		var err error
		if final {
			err = cs.sess.Close(ctx)
		} else {
			err = cs.sess.Detach(ctx)
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			r.log.Warn().Err(err).Msg("end coordination session")
		}
	}
	if err := os.RemoveAll(cs.dir); err != nil {
		r.log.Warn().Err(err).Msg("remove run directory; the reconciler will retry")
	}
}

// connected reports whether the run's bridge has reached its socket.
func (cs *coordSession) connected() bool {
	return cs != nil && cs.sess != nil && cs.sess.Connected()
}

// onCoordEvent records a coordination step on the run's event subject
// jetcrew.events.<run_id>.coord. It is a core publish (captured by the
// events stream) so a slow server never blocks the bridge.
func (w *Worker) onCoordEvent(ev coordination.Event) {
	b, err := json.Marshal(ev)
	if err != nil {
		return
	}
	m := nats.NewMsg(messages.SubjectEvents(ev.RunID, messages.EventCoord))
	m.Data = b
	m.Header.Set(messages.HeaderRunID, ev.RunID)
	if err := w.nc.PublishMsg(m); err != nil {
		w.log.Warn().Err(err).Str("run_id", ev.RunID).Msg("publish coordination event")
	}
	switch ev.Kind {
	case coordination.EventSent:
		w.metrics.coordMsgs.WithLabelValues("sent").Inc()
	case coordination.EventRead:
		w.metrics.coordMsgs.WithLabelValues("read").Add(float64(len(ev.MessageIDs)))
	}
}
