package worker_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// TestWorkspaceRunAdopted: a workspace run whose worker leaves (Leave) goes
// on in its container, its tree on the volume its capture container holds;
// the successor adopts it and, once the agent exits, captures the tree as
// the first worker would have: the result holds what the agent changed
// before and after the adoption, in attempt 1, the run's container never
// started again, and the run's containers and volume go with the run.
func TestWorkspaceRunAdopted(t *testing.T) {
	t.Parallel()
	rig := newAdoptRig(t)
	b := &rig.bundle
	ref := uploadDir(t, b)
	wrote, proceed := make(chan struct{}), make(chan struct{})
	b.rt.Behave = func(spec jail.ContainerSpec) (workertest.Behaviour, error) {
		return func(ctx context.Context, _ jail.ContainerSpec, out jail.OutputFunc) jail.ExitStatus {
			var dir string
			for _, m := range spec.Mounts {
				if m.Target == messages.WorkspaceDir {
					dir = m.Source
				}
			}
			if err := os.WriteFile(filepath.Join(dir, "b.txt"), []byte("before\n"), 0o644); err != nil {
				return jail.ExitStatus{Code: 1}
			}
			out(messages.StreamStdout, []byte("wrote b\n"))
			close(wrote)
			select {
			case <-proceed:
			case <-ctx.Done():
				return jail.ExitStatus{Code: 143}
			}
			if err := os.WriteFile(filepath.Join(dir, "c.txt"), []byte("after\n"), 0o644); err != nil {
				return jail.ExitStatus{Code: 1}
			}
			out(messages.StreamStdout, []byte("wrote c\n"))
			return jail.ExitStatus{}
		}, nil
	}
	w1 := rig.start(t, "w1")
	id := "wsadopt-" + ulidLike()
	b.submit(t, messages.RunRequest{ID: id, Profile: "shell", Prompt: "edit", Workspace: &ref})
	<-wrote
	require.Eventually(t, func() bool { st, ok := b.state(t, id); return ok && st.State == messages.StateRunning },
		10*time.Second, 20*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, w1.Leave(ctx))
	require.Equal(t, 2, b.rt.Live(), "the run's container and its capture container run on")
	require.Len(t, b.rt.Volumes(), 1, "the workspace volume stays")

	rig.start(t, "w2")
	require.Eventually(t, func() bool { st, ok := b.state(t, id); return ok && st.Adoptions == 1 && st.Worker == "w2" },
		10*time.Second, 20*time.Millisecond, "the successor adopts the run")
	close(proceed)
	st := b.waitFinal(t, id)
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.Equal(t, 1, st.Attempts)
	require.Equal(t, 1, st.Adoptions)
	require.NotNil(t, st.WorkspaceResult)
	require.Empty(t, st.WorkspaceResult.Error)
	require.Equal(t, 2, st.WorkspaceResult.FilesChanged, "both changes, before and after the adoption")
	require.Equal(t, ref.Digest, st.WorkspaceResult.Snapshot)
	require.Len(t, st.WorkspaceResult.Objects, 2, "patch and bundle")
	res, err := b.js.ObjectStore(context.Background(), messages.BucketResults)
	require.NoError(t, err)
	patch, err := res.GetBytes(context.Background(), messages.ResultObjectName(id, st.StreamSeq, 1, messages.ResultPatch))
	require.NoError(t, err)
	require.Contains(t, string(patch), "+before\n")
	require.Contains(t, string(patch), "+after\n")
	require.Equal(t, "wrote b\nwrote c\n", output(b.events(t, id), messages.StreamStdout), "stdout whole, once")
	require.Equal(t, 1, runStarts(b.rt), "the run's container was not started again")
	var captures []string
	for _, s := range b.rt.Starts() {
		if s.Labels[jail.LabelRole] == jail.RoleCapture {
			captures = append(captures, s.Name)
		}
	}
	require.Len(t, captures, 2, "the first worker's capture container, then the adopter's")
	require.Equal(t, captures[0]+"-1", captures[1], "the adopter's is named after the adoption")
	require.Eventually(t, func() bool { return b.rt.Live() == 0 && len(b.rt.Volumes()) == 0 }, 10*time.Second, 20*time.Millisecond,
		"the run's containers (both capture containers) and its volume are removed")
}
