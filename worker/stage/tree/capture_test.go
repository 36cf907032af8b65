package tree

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/workspace"
)

// TestJailWorkspaceSpec: a workspace run's container unpacks through the
// staged tool before its own argv, mounts the tree writable and the
// snapshot and tool read-only, and its receipt names them by role and
// digest; the capture container keeps the run's limits, user, image,
// runtime and labels, with network none and the tree (the delivery's
// volume) read-only, and waits for its signal.
func TestJailWorkspaceSpec(t *testing.T) {
	t.Parallel()
	tool := strings.Repeat("a", 64)
	snap := strings.Repeat("b", 64)
	rw := &runWorkspace{dir: "/state/ws/x-1-1", volume: "jetcrew-r1-7-1-ws", mib: 16, snapshot: "/state/snap/" + snap + ".tar", tool: "/state/tool/" + tool, toolDigest: tool}
	spec := jail.ContainerSpec{
		Name: "jetcrew-r1-7-1", Image: "img", Cmd: []string{"/bin/sh", "-c", "echo hi"}, User: "1000:1000", WorkingDir: "/home/agent",
		Labels: map[string]string{jail.LabelRunID: "r1", jail.LabelManaged: "true", jail.LabelRole: jail.RoleRun}, Network: "bridge", OCIRuntime: "runsc",
		MemoryBytes: 64 << 20, NanoCPUs: 5e8, PidsLimit: 32,
	}
	rw.capture = captureSpec(spec, rw, Config{MaxBytes: 1000, MaxFiles: 10}, time.Hour)
	var resp stage.PrestartResponse
	jailWorkspace(&resp, rw, Config{MaxBytes: 1000, MaxFiles: 10})

	require.Equal(t, []string{JailToolPath, "workspace", "exec", "--snapshot", JailSnapshotPath, "--dir", messages.WorkspaceDir,
		"--max-bytes", "1000", "--max-files", "10", "--held", JailGatePath + "/held", "--", "/bin/sh", "-c", "echo hi"}, append(resp.Wrap, spec.Cmd...))
	require.Equal(t, messages.WorkspaceDir, resp.WorkingDir)
	require.Equal(t, []stage.Mount{
		{Mount: jail.Mount{Source: "jetcrew-r1-7-1-ws", Volume: true, VolumeSpec: &rw.vol, Target: messages.WorkspaceDir},
			Role: messages.MountRoleWorkspace},
		{Mount: jail.Mount{Source: "/state/ws/x-1-1/in", Target: JailSnapshotDir, ReadOnly: true},
			Role: messages.MountRoleSnapshot, Digest: "sha256:" + snap},
		{Mount: jail.Mount{Source: rw.tool, Target: JailToolPath, ReadOnly: true},
			Role: messages.MountRoleWorkspaceTool, Digest: "sha256:" + tool},
		{Mount: jail.Mount{Source: rw.gate(), Target: JailGatePath, ReadOnly: true},
			Role: messages.MountRoleWorkspaceGate},
	}, resp.Mounts)

	c := rw.capture
	require.Equal(t, "jetcrew-r1-7-1-capture", c.Name)
	require.Equal(t, "none", c.Network, "the capture container has no network, whatever the run had")
	require.Equal(t, [6]any{"img", "1000:1000", "runsc", int64(64 << 20), int64(5e8), int64(32)},
		[6]any{c.Image, c.User, c.OCIRuntime, c.MemoryBytes, c.NanoCPUs, c.PidsLimit})
	require.Equal(t, int64(320<<20), captureMemory(512<<20, 192<<20), "what the run may use beside a full workspace")
	require.Equal(t, int64(64<<20), captureMemory(64<<20, 60<<20), "at least min(memory, 64 MiB)")
	require.Equal(t, int64(256<<20), captureMemory(1<<30, 900<<20), "at least a quarter of memory")
	require.Equal(t, jail.RoleRun, spec.Labels[jail.LabelRole])
	require.Equal(t, jail.RoleCapture, c.Labels[jail.LabelRole])
	delete(c.Labels, jail.LabelRole)
	delete(spec.Labels, jail.LabelRole)
	require.Equal(t, spec.Labels, c.Labels, "the reconciler sees it as the run's")
	args, err := workspace.ParseJailArgs(c.Cmd[2:])
	require.NoError(t, err)
	require.Equal(t, workspace.JailArgs{Command: "capture", Snapshot: JailCaptureInPath + "/snapshot.tar", Dir: messages.WorkspaceDir, Scratch: JailScratchPath,
		RunID: "r1", MaxBytes: 1000, MaxFiles: 10, Argv: []string{}, Wait: true, WaitMax: time.Hour}, args)
	require.Equal(t, []jail.Mount{
		{Source: "jetcrew-r1-7-1-ws", Volume: true, VolumeSpec: &rw.vol, Target: messages.WorkspaceDir, ReadOnly: true},
		{Source: "/state/ws/x-1-1/in", Target: JailCaptureInPath, ReadOnly: true},
		{Source: rw.tool, Target: JailToolPath, ReadOnly: true},
		{Source: "/state/ws/x-1-1/scratch", Target: JailScratchPath},
	}, c.Mounts)
}

// TestCaptureOutputWritten: the capture's stream counts as written once
// stderr has announced its length and stdout has brought all of it, in
// either order; a wrong length or a stream over the cap never does (the
// worker then waits for the container's exit).
func TestCaptureOutputWritten(t *testing.T) {
	t.Parallel()
	isWritten := func(o *captureOutput) bool {
		select {
		case <-o.written:
			return true
		default:
			return false
		}
	}
	newOut := func(max int64) *captureOutput {
		f, err := os.Create(filepath.Join(t.TempDir(), "capture.tar"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = f.Close() })
		return newCaptureOutput(f, max)
	}
	done := workspace.CaptureWrittenPrefix + "10\n"

	o := newOut(100)
	o.write(messages.StreamStdout, []byte("01234"))
	o.write(messages.StreamStderr, []byte(done))
	require.False(t, isWritten(o), "5 of 10 bytes")
	o.write(messages.StreamStdout, []byte("56789"))
	require.True(t, isWritten(o))
	o.write(messages.StreamStderr, []byte(done)) // closes once

	o = newOut(100)
	o.write(messages.StreamStdout, []byte("0123456789"))
	require.False(t, isWritten(o), "no announcement yet")
	o.write(messages.StreamStderr, []byte("jetcrew workspace: other\n"+done))
	require.True(t, isWritten(o))

	o = newOut(100)
	o.write(messages.StreamStdout, []byte("0123456789x"))
	o.write(messages.StreamStderr, []byte(done))
	require.False(t, isWritten(o), "more bytes than announced")

	o = newOut(8)
	o.write(messages.StreamStdout, []byte("0123456789"))
	o.write(messages.StreamStderr, []byte(done))
	require.False(t, isWritten(o), "over the cap")
}
