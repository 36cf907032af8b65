package worker_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
	"github.com/jetcrew/jetcrew/workspace"
)

// A workspace uploaded through one node of a three-node cluster (R3
// buckets) is run by a worker connected to another node, and its result is
// read through the third: no shared file system, only NATS.
func TestClusterWorkspaceAnyNode(t *testing.T) {
	t.Parallel()
	c := workertest.StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	node := func(i int) jetstream.JetStream {
		nc, err := nats.Connect(c.Nodes[i].ClientURL())
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		return js
	}
	js0, js1 := node(0), node(1)
	prov := worker.ProvisionConfig{Replicas: 3}
	require.Eventually(t, func() bool {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		defer pcancel()
		_, err := worker.Provision(pctx, js0, prov)
		return err == nil
	}, 30*time.Second, 200*time.Millisecond)

	// The client on node 0 uploads.
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.txt"), []byte("one\n"), 0o644))
	wsb, _, err := workspace.EnsureBuckets(ctx, js0, workspace.BucketConfig{Replicas: 3})
	require.NoError(t, err)
	up, err := workspace.Upload(ctx, wsb, dir, workspace.SnapshotOptions{})
	require.NoError(t, err)

	// The worker on node 2 runs it; its "agent" edits the mounted tree.
	rt := workertest.NewTestRuntime(t)
	rt.Behave = func(spec jail.ContainerSpec) (workertest.Behaviour, error) {
		return func(context.Context, jail.ContainerSpec, jail.OutputFunc) jail.ExitStatus {
			for _, m := range spec.Mounts {
				if m.Target == messages.WorkspaceDir && !m.ReadOnly && spec.WorkingDir == m.Target {
					if err := os.WriteFile(filepath.Join(m.Source, "a.txt"), []byte("two\n"), 0o644); err == nil {
						return jail.ExitStatus{}
					}
				}
			}
			return jail.ExitStatus{Code: 9}
		}, nil
	}
	nc2, err := nats.Connect(c.Nodes[2].ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc2.Close)
	log := workertest.Logger(t)
	w, err := worker.New(nc2, worker.Config{StateDir: workertest.StateDir(t), BridgePath: workertest.BridgeFile(t), ID: "wsc", Runtime: rt,
		FetchWait: 2 * time.Second, Provision: prov, Logger: &log})
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		_ = w.Stop(sctx)
	})
	data, err := json.Marshal(messages.RunRequest{ID: "wsc1", Profile: "shell", Prompt: "edit", Workspace: &up.Ref})
	require.NoError(t, err)
	_, err = js0.Publish(ctx, messages.SubjectRuns("default"), data)
	require.NoError(t, err)

	// The client on node 1 reads the state and the patch.
	kv, err := js1.KeyValue(ctx, messages.BucketRuns)
	require.NoError(t, err)
	var st messages.RunState
	require.Eventually(t, func() bool {
		e, err := kv.Get(ctx, "wsc1")
		if err != nil {
			return false
		}
		require.NoError(t, json.Unmarshal(e.Value(), &st))
		return st.State.Final()
	}, time.Minute, 50*time.Millisecond)
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.NotNil(t, st.WorkspaceResult)
	require.Equal(t, 1, st.WorkspaceResult.FilesChanged)
	res, err := js1.ObjectStore(ctx, messages.BucketResults)
	require.NoError(t, err)
	patch, err := res.GetBytes(ctx, messages.ResultObjectName("wsc1", st.StreamSeq, 1, messages.ResultPatch))
	require.NoError(t, err)
	require.Contains(t, string(patch), "-one\n+two\n")
}
