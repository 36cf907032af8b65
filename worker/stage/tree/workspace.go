package tree

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/live"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/workspace"
)

// runWorkspace is one delivery's staged workspace. The worker creates and
// mounts the directories and stages the files; it never writes a file the
// snapshot names nor reads the tree: unpacking and capture run in the jail
// (workspace_jail.go).
type runWorkspace struct {
	// dir holds scratch (the capture container's object store), in (its
	// input: the snapshot's link) and capture.tar, the capture's output
	// stream: host directories of the worker's. The tree itself is the
	// volume.
	dir string
	// volume names the delivery's tmpfs volume, the run's /workspace, of
	// mib MiB (Runtime.CreateVolume), vol its spec.
	volume string
	mib    int64
	vol    jail.VolumeSpec
	// snapshot is the cached snapshot file (snapcache.go), tool the staged
	// jetcrew binary running the in-jail commands, toolDigest its SHA-256
	// (hex).
	snapshot, tool, toolDigest string
	// sessionDir is the agent CLI's session directory in the container
	// (profile.Plan.SessionDir), kept by exec; sessionIn the host file
	// of the earlier session a follow-up restores, sessionSum its SHA-256
	// (hex), sessionNames which of its entries are kept (session.go).
	sessionDir, sessionIn, sessionSum string
	sessionNames                      workspace.SessionNames
	// capture is the spec of the capture container, made from the run's;
	// captureC the container, started (waiting) during staging, its
	// output taken by captureOut and its exit reported on captureExit;
	// captureGone, once its removal started, closes when it is removed.
	capture     jail.ContainerSpec
	captureC    jail.Container
	captureOut  *captureOutput
	captureExit chan captureExit
	stopWait    context.CancelFunc
	captureGone chan struct{}
	// stale are the ids of the capture containers of the worker the run
	// was adopted from that are still to remove (adopt.go).
	stale []string
	// scratchName names the capture container's scratch directory in
	// dir: "scratch", or an adopter's own (adopt.go).
	scratchName string
	// captureDead is set once the capture container exited (before
	// captureExit receives how).
	captureDead atomic.Bool
	// started listens on the gate's workspace.StartedSocket, to which
	// `jetcrew workspace exec` connects once the tree is unpacked
	// (awaitStarted).
	started *net.UnixListener
	// held reports once whether the capture container started (startCapture's
	// error); waitHeld takes it, heldErr keeps it.
	held     chan error
	heldOnce sync.Once
	heldErr  error
}

// waitHeld waits for the capture container's start, once, and returns its
// error: nil when the capture container runs and holds the volume.
func (rw *runWorkspace) waitHeld() error {
	rw.heldOnce.Do(func() {
		if rw.held != nil {
			rw.heldErr = <-rw.held
		}
	})
	return rw.heldErr
}

// gate is the run container's read-only gate directory: the worker writes
// heldFile into it once the capture container holds the volume, and `jetcrew
// workspace exec` waits for that file before it unpacks.
func (rw *runWorkspace) gate() string { return filepath.Join(rw.dir, "gate") }

// heldFile is the name of the file in gate that lets exec go on.
const heldFile = "held"

// scratch is the capture container's scratch directory.
func (rw *runWorkspace) scratch() string {
	if rw.scratchName != "" {
		return filepath.Join(rw.dir, rw.scratchName)
	}
	return filepath.Join(rw.dir, "scratch")
}

// in is the capture container's input directory, read-only there: the
// worker links the snapshot into it once downloaded.
func (rw *runWorkspace) in() string { return filepath.Join(rw.dir, "in") }

// workspaceDir returns the host directory of a delivery's workspace:
// StateDir/ws/<run key>-<seq>-<attempt>.
func (t *Trees) workspaceDir(run *stage.Run) string {
	return filepath.Join(t.stateDir, "ws", fmt.Sprintf("%s-%d-%d", run.Key(), run.Seq, run.Attempt))
}

// makeWorkspace returns the delivery's workspace, held for the run until
// Release: the one of the warm container the run claimed, taken over
// (stage.Placement.Workspace), or a new one (newWorkspace). The volume and
// the capture container that will hold it start while the snapshot
// downloads; the snapshot reaches both containers through a link in the
// read-only input directory.
func (s *Stage) makeWorkspace(ctx context.Context, spec *jail.ContainerSpec, prof *profile.Profile) (*runWorkspace, error) {
	if ww := s.run.Placement.Workspace; ww != nil {
		ww.Take()
		rw := s.t.takeWarm(ww.Dir)
		if rw == nil {
			rw = &runWorkspace{dir: ww.Dir, volume: ww.Volume.Name, mib: prof.WorkspaceMiB, vol: ww.Volume, tool: ww.Tool, toolDigest: ww.ToolDigest}
		}
		s.own(rw)
		if rw.captureC != nil {
			// Its capture container, made with the warm container, is
			// the run's now. It waits already: it learns the run here,
			// once signalled.
			s.hold(live.ContainerKey + rw.capture.Name)
			if err := os.WriteFile(filepath.Join(rw.in(), runIDFile), []byte(s.run.ID()+"\n"), 0o444); err != nil {
				return nil, stageError(err, false)
			}
		}
		return rw, nil
	}
	rw := &runWorkspace{dir: s.t.workspaceDir(s.run), volume: spec.Name + "-ws", mib: prof.WorkspaceMiB}
	var err error
	if rw.tool, rw.toolDigest, err = s.t.tools.Stage(s.t.toolSrc); err != nil {
		return nil, fmt.Errorf("workspace tool: %w", err)
	}
	s.own(rw)
	if err := s.t.newWorkspace(ctx, rw, prof, spec.Labels); err != nil {
		return nil, err
	}
	return rw, nil
}

// own holds rw's directory, volume and tool for the run and makes it the
// run's (Release gives up what follows, whatever fails).
func (s *Stage) own(rw *runWorkspace) {
	s.hold(holdDir + rw.dir)
	s.hold(holdVolume + rw.volume)
	s.hold(holdTool + rw.toolDigest)
	s.rw = rw
}

// newWorkspace makes rw's directories and its tmpfs volume of the
// profile's workspace_mib, owned by the profile's user and labelled with
// labels (jail.LabelRole set to jail.RoleWorkspace). The volume exists
// before any container that mounts it is created: a container created
// first would make the engine create it (from the mount's spec), and
// CreateVolume's removal of a leftover would then find it in use.
func (t *Trees) newWorkspace(ctx context.Context, rw *runWorkspace, prof *profile.Profile, labels map[string]string) error {
	uid, gid := prof.Owner()
	if err := makeWorkspaceDirs(rw, uid, gid); err != nil {
		return stageError(err, false)
	}
	rw.vol = jail.VolumeSpec{Name: rw.volume, SizeBytes: rw.mib << 20, UID: uid, GID: gid,
		Inodes: 2*int64(t.cfg.MaxFiles) + 10000, Labels: maps.Clone(labels)}
	rw.vol.Labels[jail.LabelCreated] = time.Now().UTC().Format(time.RFC3339Nano)
	rw.vol.Labels[jail.LabelRole] = jail.RoleWorkspace
	if err := t.rt.CreateVolume(ctx, rw.vol); err != nil {
		return stageError(fmt.Errorf("create the workspace volume: %w", err), errors.Is(err, jail.ErrPermanent))
	}
	return nil
}

// MakeWarm makes the workspace of a warm container whose spec is spec
// (its name and labels set), of profile prof (worker/warm): a directory
// under StateDir/ws named after the container, its empty volume (name +
// "-ws"), the staged tool, held until release, the mounts a workspace
// run's container has (workspaceMounts), its snapshot input still empty,
// and its capture container (name + "-capture", captureSpec of spec),
// started and waiting, so that a run claiming the container starts no
// container at all. The run that claims the container takes them over
// (stage.WarmWorkspace.Take, in Prestart); ww.Alive reports false once the
// capture container exited, and the pool then never hands the container
// out. release gives up the holds, and removes the capture container, the
// volume and the directory when remove is set (the container unused,
// removed first).
func (t *Trees) MakeWarm(ctx context.Context, spec jail.ContainerSpec, prof *profile.Profile) (ww *stage.WarmWorkspace, release func(remove bool), err error) {
	name := spec.Name
	rw := &runWorkspace{dir: filepath.Join(t.stateDir, "ws", name), volume: name + "-ws", mib: prof.WorkspaceMiB}
	if rw.tool, rw.toolDigest, err = t.tools.Stage(t.toolSrc); err != nil {
		return nil, nil, fmt.Errorf("workspace tool: %w", err)
	}
	releases := []func(){t.holds.Hold(holdTool + rw.toolDigest), t.holds.Hold(holdDir + rw.dir), t.holds.Hold(holdVolume + rw.volume),
		t.holds.Hold(live.ContainerKey + name + "-capture")}
	made := false
	release = func(remove bool) {
		t.takeWarm(rw.dir)
		if remove {
			if rw.started != nil {
				_ = rw.started.Close()
			}
			rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if rw.captureC != nil {
				if err := rw.captureC.Remove(rctx); err != nil {
					t.log.Warn().Err(err).Str("name", name+"-capture").Msg("remove warm capture container; the reconciler will retry")
				}
				rw.stopWait()
				rw.captureOut.close()
			}
			if made {
				if err := t.rt.RemoveVolume(rctx, rw.volume); err != nil {
					t.log.Warn().Err(err).Str("volume", rw.volume).Msg("remove warm workspace volume; the reconciler will retry")
				}
			}
			if err := os.RemoveAll(rw.dir); err != nil {
				t.log.Warn().Err(err).Str("dir", rw.dir).Msg("remove warm workspace directory")
			}
		}
		for _, r := range releases {
			r()
		}
	}
	if err := t.newWorkspace(ctx, rw, prof, spec.Labels); err != nil {
		made = !errors.Is(err, jail.ErrPermanent)
		release(true)
		return nil, nil, err
	}
	made = true
	// The longest run after a day's wait; a pool replaces an idle one
	// long before (warm.Config.MaxIdle), and the reconciler removes one a
	// crashed worker left.
	rw.capture = captureSpec(spec, rw, t.cfg, 24*time.Hour+messages.MaxTimeout+t.stopGrace+t.cfg.CaptureTimeout)
	if err := t.startCaptureContainer(ctx, rw); err != nil {
		release(true)
		return nil, nil, stageError(err, errors.Is(err, jail.ErrPermanent))
	}
	ww = &stage.WarmWorkspace{Dir: rw.dir, Volume: rw.vol, Tool: rw.tool, ToolDigest: rw.toolDigest,
		Alive: func() bool { return !rw.captureDead.Load() }}
	rw.vol = ww.Volume
	for _, m := range workspaceMounts(rw) {
		ww.Mounts = append(ww.Mounts, m.Mount)
	}
	t.warmMu.Lock()
	t.warm[rw.dir] = rw
	t.warmMu.Unlock()
	return ww, release, nil
}

// takeWarm returns the workspace MakeWarm made in dir, with its capture
// container, once: nil after that (or for another directory).
func (t *Trees) takeWarm(dir string) *runWorkspace {
	t.warmMu.Lock()
	defer t.warmMu.Unlock()
	rw := t.warm[dir]
	delete(t.warm, dir)
	return rw
}

// makeWorkspaceDirs makes rw's directory (mode 0700, the worker's), with
// an empty scratch directory owned by uid:gid, mode 0755, and an empty
// input directory (the worker's, mode 0755), after removing a leftover of
// a crashed delivery with the same name.
func makeWorkspaceDirs(rw *runWorkspace, uid, gid int) error {
	if err := os.RemoveAll(rw.dir); err != nil {
		return err
	}
	if err := os.MkdirAll(rw.dir, 0o700); err != nil {
		return err
	}
	for _, d := range []string{rw.scratch(), rw.in(), rw.gate()} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	// Empty, the worker's: the run's user owns scratch from here on. The
	// parent stays 0700 (root's).
	if err := errors.Join(os.Chown(rw.scratch(), uid, gid), os.Chmod(rw.scratch(), 0o755), os.Chmod(rw.in(), 0o755), os.Chmod(rw.gate(), 0o755)); err != nil {
		return err
	}
	return rw.listenStarted()
}

// listenStarted opens the gate's workspace.StartedSocket, which the run's
// user may connect to (mode 0666 in a directory only the worker writes).
func (rw *runWorkspace) listenStarted() error {
	sock := filepath.Join(rw.gate(), workspace.StartedSocket)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return fmt.Errorf("started socket: %w", err)
	}
	rw.started = ln
	return os.Chmod(sock, 0o666)
}
