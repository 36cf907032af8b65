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
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
)

// runDir returns the host directory staged for one delivery (attempt) of
// the request at stream sequence seq for run id: StateDir/r/<16 hex digits
// of the SHA-256 of all three>, short enough for a unix socket path. Every
// attempt has its own, so an attempt winding down never removes what the
// next one staged.
func (w *Worker) runDir(runID string, seq uint64, attempt int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d", runID, seq, attempt))
	return filepath.Join(w.cfg.StateDir, "r", hex.EncodeToString(sum[:8]))
}

// coordSession is a run's coordination: its staged directory and, when the
// socket could be served, its session.
type coordSession struct {
	dir  string
	sess *coordination.Session
	once sync.Once
	// onlyMCP is set while the directory holds nothing the worker staged
	// but mcp.json (and the session's socket): it may then go back to the
	// pool of run directories (rundirpool.go) when the run ends.
	onlyMCP bool
}

// stageRun stages a run's directory: mcp.json and the backend's files
// (prompt, CLI settings, files to seed HOME with), every file 0444 in
// directories 0755. With coordination on it also serves the run's bridge
// socket there. A directory that cannot be staged refuses the run (an
// error); a socket that cannot be served (NATS trouble) is recorded as
// coordination "unavailable" and the run goes on, its agent told so on
// every tool call.
func (r *run) stageRun(ctx context.Context, plan AgentPlan, coordOn bool) (*coordSession, error) {
	w := r.w
	dir := r.dir()
	took, sock := w.runDirs.take(dir)
	if !took {
		if err := coordination.StageRunDir(dir); err != nil {
			return nil, fmt.Errorf("run directory cannot be staged: %w", err)
		}
	}
	if sock != nil && !coordOn {
		// A socket kept for coordination runs has no use here.
		_ = sock.Close()
		_ = os.Remove(filepath.Join(dir, coordination.SocketName))
		sock = nil
	}
	defer func() {
		if sock != nil { // not handed to a session
			_ = sock.Close()
		}
	}()
	cs := &coordSession{dir: dir, onlyMCP: len(plan.Files) == 0}
	for _, f := range plan.Files {
		rel, ok := strings.CutPrefix(f.Path, coordination.ContainerRunDir+"/")
		if !ok {
			return cs, fmt.Errorf("backend file %s is outside %s", f.Path, coordination.ContainerRunDir)
		}
		host := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
			return cs, fmt.Errorf("stage %s: %w", f.Path, err)
		}
		// MkdirAll's mode passes through the worker's umask (a hardened
		// service may run with 077): set every new directory's mode so the
		// run's non-root user can read the file.
		for d := filepath.Dir(host); d != dir && strings.HasPrefix(d, dir); d = filepath.Dir(d) {
			if err := os.Chmod(d, 0o755); err != nil {
				return cs, fmt.Errorf("stage %s: %w", f.Path, err)
			}
		}
		_ = os.Remove(host) // a leftover 0444 file from an earlier delivery
		if err := os.WriteFile(host, f.Data, 0o444); err != nil {
			return cs, fmt.Errorf("stage %s: %w", f.Path, err)
		}
		if err := os.Chmod(host, f.Mode); err != nil {
			return cs, fmt.Errorf("stage %s: %w", f.Path, err)
		}
	}
	if !coordOn {
		return cs, nil
	}
	sess, err := r.serveCoord(ctx, filepath.Join(dir, coordination.SocketName), sock)
	sock = nil // the session's now, or closed
	if err != nil {
		r.log.Warn().Err(err).Msg("coordination unavailable for this run")
		r.state.Coordination = "unavailable"
		return cs, nil
	}
	cs.sess = sess
	r.state.Coordination = "available"
	return cs, nil
}

// serveCoord serves the run's coordination session on the socket at path:
// the kept socket sock when the run's directory came from the pool with
// one, else a new bind (also when sock cannot be served again). sock is the
// session's, or closed, when it returns.
func (r *run) serveCoord(ctx context.Context, path string, sock *coordination.Socket) (*coordination.Session, error) {
	info := coordination.RunInfo{RunID: r.req.ID, Group: r.req.GroupOrID(), Profile: r.req.Profile}
	if sock != nil {
		sess, err := r.w.coord.ServeSocket(ctx, info, path, sock)
		if err == nil {
			return sess, nil
		}
		r.log.Debug().Err(err).Msg("kept coordination socket not served; binding a new one")
	}
	return r.w.coord.Serve(ctx, info, path)
}

// end ends a run's coordination: a finished run leaves its group and its
// inbox is deleted; a run handed back keeps both (detach). The run
// directory is removed either way: into the pool of run directories when
// nothing of the run can reach it any more (rundirpool.go), else for good.
func (cs *coordSession) end(r *run, final bool) {
	if cs == nil {
		return
	}
	cs.once.Do(func() { cs.endOnce(r, final) })
}

func (cs *coordSession) endOnce(r *run, final bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reuse := cs.onlyMCP && r.egressSess == nil && r.containerGone
	var sock *coordination.Socket
	if cs.sess != nil {
		r.state.BridgeConnected = r.state.BridgeConnected || cs.sess.Connected()
		var err error
		switch {
		case final && reuse:
			// The directory may go to the pool: its socket stays bound
			// for the next run's session.
			sock, err = cs.sess.CloseKeepSocket(ctx)
		case final:
			err = cs.sess.Close(ctx)
		default:
			err = cs.sess.Detach(ctx)
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			r.log.Warn().Err(err).Msg("end coordination session")
		}
		// A session that did not end cleanly may have left its socket.
		reuse = reuse && err == nil
	}
	if reuse && r.w.runDirs.put(cs.dir, sock) {
		return
	}
	if sock != nil {
		_ = sock.Close()
	}
	if err := coordination.RemoveRunDir(cs.dir); err != nil {
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
	w.mu.Lock()
	if a := w.active[ev.RunID]; a != nil && a.run.prog != nil {
		a.run.prog.touch()
	}
	w.mu.Unlock()
	switch ev.Kind {
	case coordination.EventSent:
		w.metrics.coordMsgs.WithLabelValues("sent").Inc()
	case coordination.EventRead:
		w.metrics.coordMsgs.WithLabelValues("read").Add(float64(len(ev.MessageIDs)))
	}
}
