package tree

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/workspace"
)

// Container paths of a workspace run's jail tools (docs/workspaces.md,
// "Where each step runs"): the staged jetcrew binary and the snapshot, both
// read-only, and the capture container's scratch directory.
const (
	// JailToolPath is where the staged jetcrew binary (Config.WorkspaceTool)
	// is mounted, read-only, in a workspace run's container and in its
	// capture container.
	JailToolPath = "/run/jetcrew-ws/jetcrew"
	// JailSnapshotDir is the delivery's read-only snapshot input
	// directory, in the run's container and in its capture container: the
	// worker links the snapshot into it as snapshot.tar once downloaded
	// (both containers may start before that: a warm container long
	// before).
	JailSnapshotDir = "/run/jetcrew-ws/in"
	// JailSnapshotPath is the run's snapshot tar, read-only, in
	// JailSnapshotDir.
	JailSnapshotPath = JailSnapshotDir + "/snapshot.tar"
	// JailScratchPath is the capture container's writable scratch
	// directory (its git object store).
	JailScratchPath = "/run/jetcrew-ws/scratch"
	// JailCaptureInPath is the capture container's read-only input
	// directory: JailSnapshotDir.
	JailCaptureInPath = JailSnapshotDir
	// JailGatePath is the run container's read-only gate directory: the
	// worker writes "held" into it once the capture container holds the
	// workspace volume, and `jetcrew workspace exec` waits for it before it
	// unpacks.
	JailGatePath = "/run/jetcrew-ws/gate"
	// JailSessionPath is where a follow-up's earlier session (the
	// messages.ResultSession object) is, read-only, for `jetcrew workspace
	// exec --session-in` to restore: in JailSnapshotDir beside the
	// snapshot, so that a follow-up's container has the mounts of any
	// workspace run's, and may be a warm one.
	JailSessionPath = JailSnapshotDir + "/session.tar"
)

// runIDFile is the file in the input directory that names the run to a
// capture container started with a warm container (captureSpec).
const runIDFile = "run-id"

// jailWorkspace wires a staged workspace into the run's container: its
// mounts (workspaceMounts) and the command prefixed with `jetcrew
// workspace exec ... --`, which waits for the gate's held file, unpacks as
// the run's user and execs the original argv, in messages.WorkspaceDir.
func jailWorkspace(resp *stage.PrestartResponse, rw *runWorkspace, cfg Config) {
	args := workspace.JailArgs{Command: "exec", Snapshot: JailSnapshotPath, Dir: messages.WorkspaceDir,
		MaxBytes: cfg.MaxBytes, MaxFiles: cfg.MaxFiles, Held: JailGatePath + "/" + heldFile, Session: rw.sessionDir, SessionNames: rw.sessionNames}
	if rw.sessionIn != "" {
		args.SessionIn = JailSessionPath
	}
	resp.Wrap = append([]string{JailToolPath}, args.ArgList()...)
	resp.Mounts = append(resp.Mounts, workspaceMounts(rw)...)
	resp.WorkingDir = messages.WorkspaceDir
}

// workspaceMounts returns a workspace run's mounts of rw: the delivery's
// volume writable at messages.WorkspaceDir, the snapshot input directory,
// the tool and the gate directory read-only (the receipt names them by
// role, the snapshot and the tool by digest; the snapshot's is empty until
// rw.snapshot is set). A warm container made for workspace runs is created
// with the same mounts (Trees.MakeWarm), its directories empty.
func workspaceMounts(rw *runWorkspace) []stage.Mount {
	snapDigest := ""
	if rw.snapshot != "" {
		snapDigest = "sha256:" + strings.TrimSuffix(filepath.Base(rw.snapshot), ".tar")
	}
	return []stage.Mount{
		{Mount: jail.Mount{Source: rw.volume, Volume: true, VolumeSpec: &rw.vol, Target: messages.WorkspaceDir},
			Role: messages.MountRoleWorkspace},
		{Mount: jail.Mount{Source: rw.in(), Target: JailSnapshotDir, ReadOnly: true},
			Role: messages.MountRoleSnapshot, Digest: snapDigest},
		{Mount: jail.Mount{Source: rw.tool, Target: JailToolPath, ReadOnly: true},
			Role: messages.MountRoleWorkspaceTool, Digest: "sha256:" + rw.toolDigest},
		{Mount: jail.Mount{Source: rw.gate(), Target: JailGatePath, ReadOnly: true},
			Role: messages.MountRoleWorkspaceGate},
	}
}

// captureSpec returns the capture container's spec, from the run's
// (before jailWorkspace): the run's image, user, OCI runtime, memory, CPU
// and pids limits and labels (so the reconciler treats it as the run's;
// jail.LabelRole is jail.RoleCapture),
// network none, a small /tmp, the volume, the input directory (the
// snapshot) and the tool read-only, the scratch directory writable, and
// the command `jetcrew workspace capture --wait`. The runtime adds the hardening every
// container gets (read-only root, no capabilities, no new privileges,
// init).
//
// A warm container's (run.Labels' jail.LabelRole is jail.RoleWarm: no run
// yet, so no jail.LabelRunID either) reads its run id from the input
// directory's run-id file (runIDFile), which the claiming run writes.
func captureSpec(run jail.ContainerSpec, rw *runWorkspace, cfg Config, waitMax time.Duration) jail.ContainerSpec {
	labels := maps.Clone(run.Labels)
	args := workspace.JailArgs{Command: "capture", Snapshot: JailCaptureInPath + "/snapshot.tar", Dir: messages.WorkspaceDir,
		Scratch: JailScratchPath, RunID: run.Labels[jail.LabelRunID], MaxBytes: cfg.MaxBytes, MaxFiles: cfg.MaxFiles, Wait: true, WaitMax: waitMax}
	if labels[jail.LabelRole] == jail.RoleWarm {
		args.RunID, args.RunIDFile = "", JailCaptureInPath+"/"+runIDFile
	}
	labels[jail.LabelRole] = jail.RoleCapture
	return jail.ContainerSpec{
		Name:        run.Name + "-capture",
		Image:       run.Image,
		Cmd:         append([]string{JailToolPath}, args.ArgList()...),
		Env:         []string{"HOME=/tmp", fmt.Sprintf("GOMEMLIMIT=%dMiB", captureGoMemLimit(captureMemory(run.MemoryBytes, rw.mib<<20)))},
		User:        run.User,
		WorkingDir:  "/",
		Labels:      labels,
		Network:     "none",
		OCIRuntime:  run.OCIRuntime,
		MemoryBytes: captureMemory(run.MemoryBytes, rw.mib<<20),
		NanoCPUs:    run.NanoCPUs,
		PidsLimit:   run.PidsLimit,
		Tmpfs:       jail.TmpfsMounts{{Target: "/tmp", SizeBytes: 16 << 20, Mode: 0o1777}},
		Mounts: []jail.Mount{
			{Source: rw.volume, Volume: true, VolumeSpec: &rw.vol, Target: messages.WorkspaceDir, ReadOnly: true},
			{Source: rw.in(), Target: JailCaptureInPath, ReadOnly: true},
			{Source: rw.tool, Target: JailToolPath, ReadOnly: true},
			{Source: rw.scratch(), Target: JailScratchPath},
		},
	}
}

// early returns why a capture container that exited before its capture
// gave no result: its wait's error, else its exit and out's last line.
func (ex captureExit) early(out *captureOutput) error {
	if ex.err != nil {
		return ex.err
	}
	return fmt.Errorf("the capture container exited before the capture (exit code %d, OOM killed %t): %s", ex.st.Code, ex.st.OOMKilled, out.lastLine())
}

// captureMemory returns the capture container's memory limit, in bytes,
// for a run of memory bytes whose workspace is volume bytes: what the run
// may use beside a full workspace, at least a quarter of memory and at
// least min(memory, 64 MiB) (the engine refuses less than 6 MiB). Once the
// run's container is gone, the tree's tmpfs pages count against no
// container's limit (the kernel charged them to the run's, now removed), so
// this keeps a run, capture included, within about its memory_mib.
func captureMemory(memory, volume int64) int64 {
	return max(memory-volume, memory/4, min(memory, 64<<20))
}

// captureGoMemLimit returns the Go memory limit of the capture, in MiB,
// for a capture container of memory bytes: half of it (GOMEMLIMIT, a soft
// limit the Go runtime's collector keeps the heap under), leaving the rest
// to what is not the Go heap — under gVisor its Sentry and page cache —
// so a capture that loads the snapshot and reads the tree back to back
// collects the load's garbage before the kernel's limit kills it.
func captureGoMemLimit(memory int64) int64 { return max(memory/2>>20, 16) }

// captureExit is how the capture container ended (its Wait).
type captureExit struct {
	st  jail.ExitStatus
	err error
}

// startCapture starts the capture container, which
// waits for SIGUSR1: while it runs, the engine keeps the volume mounted, so
// the tree outlives the run's container until the capture (a tmpfs volume
// is unmounted, its content lost, when no running container mounts it).
// Its stdout goes to capture.tar in the delivery's directory, up to the
// stream cap. An error wrapping jail.ErrPermanent means the engine refused the
// volume or the container for good.
func (s *Stage) startCapture(ctx context.Context) error {
	return s.t.startCaptureContainer(ctx, s.rw)
}

// startCaptureContainer starts rw's capture container (rw.capture) with
// its output into capture.tar in rw's directory, and waits for its exit in
// the background: rw.captureExit receives it, and rw.captureDead is set
// first.
func (t *Trees) startCaptureContainer(ctx context.Context, rw *runWorkspace) error {
	f, err := os.OpenFile(filepath.Join(rw.dir, "capture.tar"), os.O_RDWR|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	streamCap, _ := maxCaptureStream(t.cfg)
	rw.captureOut = newCaptureOutput(f, streamCap)
	spec := rw.capture
	spec.Labels = maps.Clone(spec.Labels)
	if created := rw.vol.Labels[jail.LabelCreated]; created != "" {
		spec.Labels[jail.LabelCreated] = created
	}
	c, err := t.rt.Start(ctx, spec, rw.captureOut.write)
	if err != nil {
		return fmt.Errorf("start the capture container: %w", err)
	}
	rw.captureC = c
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	rw.stopWait, rw.captureExit = cancel, make(chan captureExit, 1)
	go func() {
		st, err := c.Wait(wctx)
		rw.captureDead.Store(true)
		rw.captureExit <- captureExit{st, err}
	}()
	return nil
}

// holdWorkspace lets a workspace run's container, c, go on once the capture
// container holds the volume: it waits for the capture container's start
// (begun during staging, usually done by now) and writes the gate's held
// file, for which `jetcrew workspace exec` waits before it unpacks. Until
// then the run's container only waits, so it cannot end, and unmount the
// tree, before the capture container holds it; the worker does not stop it
// meanwhile (Poststart runs before the engine lets cancels stop it, so a
// cancel waits, and a cancel that came meanwhile, cancelled() true, makes
// this return an error without writing the file: the run's container never
// unpacks). Once the file is written, exec unpacks the whole tree before it
// heeds a stop. An error wrapping jail.ErrPermanent means the engine
// refused the capture container for good; a transient one that it could
// not start now.
func (s *Stage) holdWorkspace(cancelled func() bool) error {
	rw := s.rw
	if rw == nil {
		return nil
	}
	if err := rw.waitHeld(); err != nil {
		return stageError(err, errors.Is(err, jail.ErrPermanent))
	}
	if cancelled() {
		// A cancel came while the capture container started: the run's
		// container, waiting in exec, is removed before it unpacks
		// anything (start records the run cancelled).
		return errors.New("cancelled before the workspace was held")
	}
	if err := os.WriteFile(filepath.Join(rw.gate(), heldFile), nil, 0o444); err != nil {
		return stageError(err, false)
	}
	s.awaitStarted() // snapcache.go
	return nil
}

// maxCaptureStream bounds the capture container's stdout for a worker
// whose caps are cfg: every object at most twice MaxBytes (a patch holds
// the removed and the added lines) plus 1 MiB, and the record.
func maxCaptureStream(cfg Config) (stream, object int64) {
	object = 2*cfg.MaxBytes + 1<<20
	return 3*object + 8<<20, object
}

// runCapture has the capture container capture the run's tree (its own
// container has exited): once the container says it waits
// (workspace.CaptureReadyLine), SIGUSR1 starts the capture, bounded by
// cfg.CaptureTimeout; its stdout is in capture.tar up to the stream cap,
// from which the result is read (workspace.ReadCaptureStream). The
// container is removed whatever happens, in the background once it has
// exited (s.rw.captureGone closes when done).
func (s *Stage) runCapture(ctx context.Context, cfg Config) (*workspace.CaptureStream, error) {
	rw := s.rw
	if rw.captureC == nil {
		return nil, errors.New("no capture container")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.CaptureTimeout)
	defer cancel()
	// Removed while the result uploads; dropWorkspace waits for it, so it
	// is gone before the run's finished event, as the run's container is.
	gone := make(chan struct{})
	rw.captureGone = gone
	defer func() {
		go func() {
			defer close(gone)
			s.removeCapture(rw.captureC)
		}()
	}()
	out := rw.captureOut
	var ex captureExit
	select {
	case <-out.ready:
		if err := rw.captureC.Signal(ctx, "SIGUSR1"); err != nil {
			// It may have exited meanwhile: how it exited says more (its
			// wait may report it a moment after the engine refused).
			select {
			case ex = <-rw.captureExit:
				return nil, ex.early(out)
			case <-time.After(time.Second):
			}
			return nil, fmt.Errorf("signal the capture container: %w (its last line: %s)", err, out.lastLine())
		}
		select {
		case ex = <-rw.captureExit:
		case <-out.written:
			// The whole stream is here and the capture said it succeeded:
			// its exit (0) is not waited for; the container is removed in
			// the background.
			ex = captureExit{}
		case <-ctx.Done():
			return nil, fmt.Errorf("the capture container did not end within %s", cfg.CaptureTimeout)
		}
	case ex = <-rw.captureExit:
		ex.err = ex.early(out)
	case <-ctx.Done():
		return nil, fmt.Errorf("the capture container was not ready within %s", cfg.CaptureTimeout)
	}
	if ex.err != nil {
		return nil, ex.err
	}
	if err := out.failed(ex.st); err != nil {
		return nil, err
	}
	_, objectCap := maxCaptureStream(cfg)
	info, err := out.f.Stat()
	if err != nil {
		return nil, err
	}
	// The objects stay in the file: read, hashed and uploaded from it,
	// never held in the worker's memory.
	return workspace.ReadCaptureStream(out.f, info.Size(), objectCap)
}

// removeCapture removes the capture container c, within 30 seconds; a
// failure is logged (the reconciler retries).
func (s *Stage) removeCapture(c jail.Container) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Remove(ctx); err != nil {
		s.run.Log.Warn().Err(err).Msg("remove the capture container; the reconciler will retry")
	}
}

// captureOutput takes the capture container's output: stdout into f up to
// max bytes, the last line of stderr.
// ready closes when stderr carries workspace.CaptureReadyLine; written
// once stderr has said the stream is written (workspace.CaptureWrittenPrefix)
// and f holds all of it.
type captureOutput struct {
	mu          sync.Mutex
	f           *os.File
	n, max      int64
	over        bool
	err         error
	lastErr     string
	ready       chan struct{}
	readySeen   bool
	full        bool  // stderr carried workspace.FullLine
	want        int64 // the stream's length the capture announced, -1 until then
	written     chan struct{}
	writtenSeen bool
}

// newCaptureOutput returns a captureOutput writing stdout into f, up to
// max bytes.
func newCaptureOutput(f *os.File, max int64) *captureOutput {
	return &captureOutput{f: f, max: max, ready: make(chan struct{}), want: -1, written: make(chan struct{})}
}

// checkWritten closes written once the announced stream is whole in f.
func (o *captureOutput) checkWritten() {
	if !o.writtenSeen && o.want >= 0 && o.n == o.want && !o.over && o.err == nil {
		o.writtenSeen = true
		close(o.written)
	}
}

func (o *captureOutput) write(stream string, p []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if stream != messages.StreamStdout {
		if s := strings.TrimSpace(string(p)); s != "" {
			lines := strings.Split(s, "\n")
			if !o.readySeen && slices.Contains(lines, workspace.CaptureReadyLine) {
				o.readySeen = true
				close(o.ready)
			}
			o.full = o.full || slices.Contains(lines, workspace.FullLine)
			for _, l := range lines {
				if v, ok := strings.CutPrefix(l, workspace.CaptureWrittenPrefix); ok && o.want < 0 {
					if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
						o.want = n
					}
				}
			}
			o.checkWritten()
			o.lastErr = lines[len(lines)-1]
			if len(o.lastErr) > 1024 {
				o.lastErr = o.lastErr[:1024]
			}
		}
		return
	}
	if o.over || o.err != nil {
		return
	}
	if o.n+int64(len(p)) > o.max {
		o.over = true
		return
	}
	o.n += int64(len(p))
	_, o.err = o.f.Write(p)
	o.checkWritten()
}

// workspaceFull reports whether the capture said the workspace was full.
func (o *captureOutput) workspaceFull() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.full
}

// lastLine returns the last line of stderr.
func (o *captureOutput) lastLine() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lastErr
}

// close closes the output file.
func (o *captureOutput) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	_ = o.f.Close()
}

// failed returns why the capture gave no usable stream, or nil.
func (o *captureOutput) failed(st jail.ExitStatus) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	msg, jailed := strings.CutPrefix(o.lastErr, workspace.JailErrPrefix+"capture failed: ")
	switch {
	case st.Code == workspace.JailExitCode && jailed:
		return errors.New(msg)
	case st.OOMKilled || st.Code == 137:
		return fmt.Errorf("the capture container was killed (exit code %d, OOM killed %t): the run's repository needs more than the profile's memory", st.Code, st.OOMKilled)
	case st.Code != 0:
		return fmt.Errorf("the capture container exited with code %d: %s", st.Code, o.lastErr)
	case o.over:
		return fmt.Errorf("the capture's output exceeds %d bytes", o.max)
	}
	return o.err
}
