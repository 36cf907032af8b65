package worker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/workertest"
	"github.com/jetcrew/jetcrew/workspace"
)

// uploadDir snapshots a one-file directory into b's workspace bucket.
func uploadDir(t *testing.T, b *testBundle) messages.WorkspaceRef {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.txt"), []byte("one\n"), 0o644))
	wsb, _, err := workspace.EnsureBuckets(context.Background(), b.js, workspace.BucketConfig{})
	require.NoError(t, err)
	up, err := workspace.Upload(context.Background(), wsb, dir, workspace.SnapshotOptions{})
	require.NoError(t, err)
	return up.Ref
}

// TestWorkspaceSnapshotCachedOnce: three runs on one snapshot share one
// cached, read-only snapshot file; each run's container unpacks it (the
// agent sees the tree) and a capture container records its result.
func TestWorkspaceSnapshotCachedOnce(t *testing.T) {
	t.Parallel()
	state := workertest.StateDir(t)
	b := setup(t, func(c *worker.Config) { c.StateDir = state })
	ref := uploadDir(t, b)
	seen := make(chan string, 3)
	b.rt.Behave = func(spec jail.ContainerSpec) (workertest.Behaviour, error) {
		return func(context.Context, jail.ContainerSpec, jail.OutputFunc) jail.ExitStatus {
			for _, m := range spec.Mounts {
				if m.Target == messages.WorkspaceDir {
					data, _ := os.ReadFile(filepath.Join(m.Source, "a.txt"))
					seen <- string(data)
					_ = os.WriteFile(filepath.Join(m.Source, "b.txt"), []byte("new\n"), 0o644)
				}
			}
			return jail.ExitStatus{}
		}, nil
	}
	for _, id := range []string{"c1", "c2", "c3"} {
		b.submit(t, messages.RunRequest{ID: id, Profile: "shell", Prompt: "x", Workspace: &ref})
	}
	for _, id := range []string{"c1", "c2", "c3"} {
		st := b.waitFinal(t, id)
		require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
		require.Equal(t, "one\n", <-seen, "the agent saw the unpacked tree")
		require.NotNil(t, st.WorkspaceResult)
		require.Empty(t, st.WorkspaceResult.Error)
		require.Equal(t, 1, st.WorkspaceResult.FilesChanged)
		require.Len(t, st.WorkspaceResult.Objects, 2, "patch and bundle")
	}
	ents, err := os.ReadDir(filepath.Join(state, "snap"))
	require.NoError(t, err)
	require.Len(t, ents, 1, "one cached snapshot for three runs")
	info, err := ents[0].Info()
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o444), info.Mode().Perm())
	var capture int
	for _, s := range b.rt.Starts() {
		if s.Labels[jail.LabelRole] == jail.RoleCapture {
			require.True(t, strings.HasSuffix(s.Name, "-capture"))
			capture++
			require.Equal(t, "none", s.Network)
		}
	}
	require.Equal(t, 3, capture, "one capture container per run")
	var vols []string
	for _, s := range b.rt.Starts() {
		for _, m := range s.Mounts {
			if m.Target == messages.WorkspaceDir {
				require.True(t, m.Volume, "the tree is a volume")
				require.Equal(t, s.Labels[jail.LabelRole] == jail.RoleCapture, m.ReadOnly, "read-only in the capture container only")
				vols = append(vols, m.Source)
			}
		}
	}
	require.Len(t, vols, 6)
	require.Eventually(t, func() bool { return len(b.rt.Volumes()) == 0 }, 10*time.Second, 10*time.Millisecond,
		"each run's volume is removed with it")
}

// TestWorkspaceUnpackFailureIsFinal: when `jetcrew workspace exec` reports
// that the snapshot did not unpack, the run fails at once with that reason
// and a dead letter, even with retries left, and nothing is captured.
func TestWorkspaceUnpackFailureIsFinal(t *testing.T) {
	t.Parallel()
	ps, err := profile.ParseProfiles("p.toml", []byte("[profiles.tiny]\nimage='jetcrew-sandbox:latest'\ncommand=['/bin/sh','-c','{prompt}']\ncoordination=false\nretries=3\n"))
	require.NoError(t, err)
	b := setup(t, func(c *worker.Config) { c.Profiles = ps })
	ref := uploadDir(t, b)
	b.rt.Behave = func(spec jail.ContainerSpec) (workertest.Behaviour, error) {
		return func(_ context.Context, _ jail.ContainerSpec, out jail.OutputFunc) jail.ExitStatus {
			out(messages.StreamStderr, []byte("jetcrew workspace: unpack failed (no-space): write a.txt: no space left on device\n"))
			return jail.ExitStatus{Code: workspace.JailExitCode}
		}, nil
	}
	b.submit(t, messages.RunRequest{ID: "u1", Profile: "tiny", Prompt: "x", Workspace: &ref})
	st := b.waitFinal(t, "u1")
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, 1, st.Attempts, "never retried")
	require.Contains(t, st.Reason, "the snapshot does not fit the profile's workspace_mib")
	require.Nil(t, st.WorkspaceResult)
	// The dead letter follows the final state.
	require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamFailed) == 1 }, 20*time.Second, 20*time.Millisecond, "a dead letter")
}

// TestWorkspaceCachedSnapshotWithdrawn: a snapshot deleted from the
// buckets no longer serves runs, though the worker has it cached: the next
// run on it fails as a missing snapshot would, before its container
// starts. Deleted from the workspace bucket alone, its upload still serves
// (a worker stores an upload in the workspace bucket only once the run's
// agent started: a second run may come first).
func TestWorkspaceCachedSnapshotWithdrawn(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ref := uploadDir(t, b)
	b.submit(t, messages.RunRequest{ID: "w1", Profile: "shell", Prompt: "x", Workspace: &ref})
	st := b.waitFinal(t, "w1")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)

	wsb, _, err := workspace.EnsureBuckets(context.Background(), b.js, workspace.BucketConfig{})
	require.NoError(t, err)
	require.NoError(t, wsb.Delete(context.Background(), ref.Name))
	b.submit(t, messages.RunRequest{ID: "w1b", Profile: "shell", Prompt: "x", Workspace: &ref})
	st = b.waitFinal(t, "w1b")
	require.Equal(t, messages.StateSucceeded, st.State, "its upload still serves: %s", st.Reason)
	require.NoError(t, wsb.Uploads.Delete(context.Background(), ref.Name))
	b.submit(t, messages.RunRequest{ID: "w2", Profile: "shell", Prompt: "x", Workspace: &ref})
	st = b.waitFinal(t, "w2")
	require.Equal(t, messages.StateFailed, st.State)
	require.Contains(t, st.Reason, "workspace snapshot not found")
	require.Nil(t, st.ExitCode, "the run's container never started")
}

// countAgents makes rt's containers agents that exit 0 at once and returns
// how many ran: an agent runs only after exec's wait and unpack.
func countAgents(rt *workertest.Runtime) *atomic.Int32 {
	var n atomic.Int32
	rt.Behave = func(jail.ContainerSpec) (workertest.Behaviour, error) {
		return func(context.Context, jail.ContainerSpec, jail.OutputFunc) jail.ExitStatus {
			n.Add(1)
			return jail.ExitStatus{}
		}, nil
	}
	return &n
}

// runStarts returns how many of rt's started containers were runs' own
// (jail.RoleRun), not capture containers.
func runStarts(rt *workertest.Runtime) int {
	n := 0
	for _, s := range rt.Starts() {
		if s.Labels[jail.LabelRole] == jail.RoleRun {
			n++
		}
	}
	return n
}

// TestWorkspaceCaptureRefused: the run's container starts beside the
// capture container and waits, in exec, for the worker's held file. When
// the engine refuses the capture container, the run's agent never runs and
// its container is removed: for good (ErrPermanent) the run fails with the
// reason; otherwise the request is retried and the next delivery runs.
func TestWorkspaceCaptureRefused(t *testing.T) {
	t.Parallel()
	for _, permanent := range []bool{true, false} {
		t.Run(fmt.Sprintf("permanent=%t", permanent), func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			ref := uploadDir(t, b)
			var refused atomic.Int32
			b.rt.StartErr = func(spec jail.ContainerSpec) error {
				if spec.Labels[jail.LabelRole] != jail.RoleCapture || refused.Add(1) > 1 {
					return nil
				}
				if permanent {
					return fmt.Errorf("no such image: %w", jail.ErrPermanent)
				}
				return errors.New("engine busy")
			}
			agents := countAgents(b.rt)
			b.submit(t, messages.RunRequest{ID: "cr", Profile: "shell", Prompt: "x", Workspace: &ref})
			st := b.waitFinal(t, "cr")
			runs := runStarts(b.rt)
			if permanent {
				require.Equal(t, messages.StateFailed, st.State)
				require.Contains(t, st.Reason, "no such image")
				require.Equal(t, 1, st.Attempts)
				require.Zero(t, agents.Load(), "the agent never ran: exec waited for the held file")
				require.Equal(t, 1, runs, "the run's container had started beside the capture container")
			} else {
				require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
				require.Equal(t, 2, st.Attempts)
				require.Equal(t, int32(1), agents.Load(), "only the second delivery's agent ran")
				require.Equal(t, 2, runs)
				require.NotNil(t, st.WorkspaceResult)
				require.Empty(t, st.WorkspaceResult.Error)
			}
			require.Eventually(t, func() bool { return b.rt.Live() == 0 && len(b.rt.Volumes()) == 0 }, 10*time.Second, 10*time.Millisecond,
				"no container or volume left")
		})
	}
}

// TestWorkspaceCancelWhileHeld: a cancel that comes while the capture
// container is still starting (the run's container already started,
// waiting in exec) ends the run cancelled without its agent, without
// unpacking, without a result, and leaves nothing behind.
func TestWorkspaceCancelWhileHeld(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ref := uploadDir(t, b)
	release := make(chan struct{})
	b.rt.StartErr = func(spec jail.ContainerSpec) error {
		if spec.Labels[jail.LabelRole] == jail.RoleCapture {
			<-release
		}
		return nil
	}
	agents := countAgents(b.rt)
	b.submit(t, messages.RunRequest{ID: "ch", Profile: "shell", Prompt: "x", Workspace: &ref})
	require.Eventually(t, func() bool { return runStarts(b.rt) > 0 }, 10*time.Second, 5*time.Millisecond, "the run's container starts while the capture container is still starting")
	b.cancel(t, "ch")
	close(release)
	st := b.waitFinal(t, "ch")
	require.Equal(t, messages.StateCancelled, st.State, st.Reason)
	require.Zero(t, agents.Load())
	require.Nil(t, st.WorkspaceResult, "nothing was unpacked, nothing captured")
	require.Eventually(t, func() bool { return b.rt.Live() == 0 && len(b.rt.Volumes()) == 0 }, 10*time.Second, 10*time.Millisecond,
		"no container or volume left")
}
