package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jetcrew/jetcrew/messages"
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
	// JailSnapshotPath is where the run's snapshot tar is mounted,
	// read-only.
	JailSnapshotPath = "/run/jetcrew-ws/snapshot.tar"
	// JailScratchPath is the capture container's writable scratch
	// directory (its git object store).
	JailScratchPath = "/run/jetcrew-ws/scratch"
)

// jailWorkspace wires a staged workspace into the run's spec: the empty
// tree writable at messages.WorkspaceDir (the working directory), the
// snapshot and the tool read-only, and the command prefixed with `jetcrew
// workspace exec`, which unpacks as the run's user and execs the original
// argv. It also derives the capture container's spec from the run's.
func jailWorkspace(spec *ContainerSpec, rw *runWorkspace, cfg WorkspaceConfig) {
	args := workspace.JailArgs{Command: "exec", Snapshot: JailSnapshotPath, Dir: messages.WorkspaceDir,
		MaxBytes: cfg.MaxBytes, MaxFiles: cfg.MaxFiles, Argv: spec.Cmd}
	spec.Cmd = append([]string{JailToolPath}, args.ArgList()...)
	spec.Mounts = append(spec.Mounts,
		Mount{Source: rw.tree(), Target: messages.WorkspaceDir},
		Mount{Source: rw.snapshot, Target: JailSnapshotPath, ReadOnly: true},
		Mount{Source: rw.tool, Target: JailToolPath, ReadOnly: true})
	spec.WorkingDir = messages.WorkspaceDir
	rw.capture = captureSpec(*spec, rw, cfg)
}

// captureSpec returns the capture container's spec: the run's image, user,
// OCI runtime, memory, CPU and pids limits and labels (so the reconciler
// treats it as the run's), network none, a small /tmp, the tree and the
// snapshot read-only, the scratch directory writable, and the command
// `jetcrew workspace capture`. The runtime adds the hardening every
// container gets (read-only root, no capabilities, no new privileges,
// init).
func captureSpec(run ContainerSpec, rw *runWorkspace, cfg WorkspaceConfig) ContainerSpec {
	args := workspace.JailArgs{Command: "capture", Snapshot: JailSnapshotPath, Dir: messages.WorkspaceDir,
		Scratch: JailScratchPath, RunID: run.Labels[LabelRunID], MaxBytes: cfg.MaxBytes, MaxFiles: cfg.MaxFiles}
	return ContainerSpec{
		Name:        run.Name + "-capture",
		Image:       run.Image,
		Cmd:         append([]string{JailToolPath}, args.ArgList()...),
		Env:         []string{"HOME=/tmp"},
		User:        run.User,
		WorkingDir:  "/",
		Labels:      maps.Clone(run.Labels),
		Network:     "none",
		OCIRuntime:  run.OCIRuntime,
		MemoryBytes: run.MemoryBytes,
		NanoCPUs:    run.NanoCPUs,
		PidsLimit:   run.PidsLimit,
		Tmpfs:       map[string]string{"/tmp": "size=16m,mode=1777"},
		Mounts: []Mount{
			{Source: rw.tree(), Target: messages.WorkspaceDir, ReadOnly: true},
			{Source: rw.snapshot, Target: JailSnapshotPath, ReadOnly: true},
			{Source: rw.tool, Target: JailToolPath, ReadOnly: true},
			{Source: rw.scratch(), Target: JailScratchPath},
		},
	}
}

// maxCaptureStream bounds the capture container's stdout for a worker
// whose caps are cfg: every object at most twice MaxBytes (a patch holds
// the removed and the added lines) plus 1 MiB, and the record.
func maxCaptureStream(cfg WorkspaceConfig) (stream, object int64) {
	object = 2*cfg.MaxBytes + 1<<20
	return 3*object + 8<<20, object
}

// runCapture runs the capture container of the run (its own container has
// exited), bounded by cfg.CaptureTimeout, its stdout written to a file of
// the worker's (capture.tar in the delivery's directory) up to the stream
// cap, and reads the result from that file (workspace.ReadCaptureStream).
// The container is removed whatever happens, in the background once it
// has exited (r.ws.captureGone closes when done).
func (r *run) runCapture(ctx context.Context, cfg WorkspaceConfig) (*workspace.Captured, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.CaptureTimeout)
	defer cancel()
	path := filepath.Join(r.ws.dir, "capture.tar")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	streamCap, objectCap := maxCaptureStream(cfg)
	out := &captureOutput{f: f, max: streamCap}
	spec := r.ws.capture
	spec.Labels = maps.Clone(spec.Labels)
	spec.Labels[LabelCreated] = time.Now().UTC().Format(time.RFC3339Nano)
	c, err := r.w.cfg.Runtime.Start(ctx, spec, out.write)
	if err != nil {
		return nil, fmt.Errorf("start the capture container: %w", err)
	}
	// Removed while the result uploads; dropWorkspace waits for it, so it
	// is gone before the run's finished event, as the run's container is.
	gone := make(chan struct{})
	r.ws.captureGone = gone
	defer func() {
		go func() {
			defer close(gone)
			rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer rcancel()
			if err := c.Remove(rctx); err != nil {
				r.log.Warn().Err(err).Msg("remove the capture container; the reconciler will retry")
			}
		}()
	}()
	st, err := c.Wait(ctx)
	if err != nil {
		return nil, fmt.Errorf("the capture container did not end within %s: %w", cfg.CaptureTimeout, err)
	}
	if err := out.failed(st); err != nil {
		return nil, err
	}
	if _, err := f.Seek(0, 0); err != nil {
		return nil, err
	}
	return workspace.ReadCaptureStream(f, objectCap)
}

// captureOutput takes the capture container's output: stdout into f up to
// max bytes, the last line of stderr.
type captureOutput struct {
	mu      sync.Mutex
	f       *os.File
	n, max  int64
	over    bool
	err     error
	lastErr string
}

func (o *captureOutput) write(stream string, p []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if stream != messages.StreamStdout {
		if s := strings.TrimSpace(string(p)); s != "" {
			lines := strings.Split(s, "\n")
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
}

// failed returns why the capture gave no usable stream, or nil.
func (o *captureOutput) failed(st ExitStatus) error {
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
