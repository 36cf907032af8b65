package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// On a three-node JetStream cluster with R3 streams, 200 short runs through
// two workers each end exactly once, although one node is killed mid-load
// and restarted.
func TestClusterNodeLossEveryRunOnce(t *testing.T) {
	t.Parallel()
	c := workertest.StartCluster(t, 3)
	connect := func() *nats.Conn {
		nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}
	prov := worker.ProvisionConfig{Replicas: 3, AckWait: 5 * time.Second}
	js, err := jetstream.New(connect())
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := worker.Provision(ctx, js, prov)
		return err == nil
	}, 30*time.Second, 200*time.Millisecond)

	rts := []*workertest.Runtime{workertest.NewTestRuntime(t), workertest.NewTestRuntime(t)}
	for i, rt := range rts {
		log := workertest.Logger(t)
		w, err := worker.New(connect(), worker.Config{StateDir: workertest.StateDir(t), BridgePath: workertest.BridgeFile(t), ID: fmt.Sprintf("cw%d", i), Runtime: rt, Concurrency: 8,
			FetchWait: 2 * time.Second, Provision: prov, Logger: &log})
		require.NoError(t, err)
		require.NoError(t, w.Start(context.Background()))
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = w.Stop(ctx)
		})
	}

	const n = 200
	pub := func(i int) {
		data, _ := json.Marshal(messages.RunRequest{ID: fmt.Sprintf("cl%03d", i), Profile: "shell", Prompt: "sleep 20ms; out ok"})
		require.Eventually(t, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_, err := js.Publish(ctx, messages.SubjectRuns("default"), data, jetstream.WithMsgID(fmt.Sprintf("cl%03d", i)))
			return err == nil
		}, 30*time.Second, 100*time.Millisecond)
	}
	for i := range n / 2 {
		pub(i)
	}
	// Kill the node the first client is not necessarily on: node 2.
	c.Kill(1)
	for i := n / 2; i < n; i++ {
		pub(i)
	}
	time.Sleep(500 * time.Millisecond)
	c.Restart(1)

	// Read states from the stream leader, not with a direct get: a direct get
	// may be answered by the restarted node while it still catches up.
	nc := connect()
	final := func(id string) (messages.RunState, bool) {
		req, _ := json.Marshal(map[string]string{"last_by_subj": "$KV." + messages.BucketRuns + "." + id})
		resp, err := nc.Request("$JS.API.STREAM.MSG.GET.KV_"+messages.BucketRuns, req, 3*time.Second)
		if err != nil {
			return messages.RunState{}, false
		}
		var r struct {
			Message struct {
				Data []byte `json:"data"`
			} `json:"message"`
		}
		var st messages.RunState
		if json.Unmarshal(resp.Data, &r) != nil || json.Unmarshal(r.Message.Data, &st) != nil {
			return messages.RunState{}, false
		}
		return st, st.State.Final()
	}
	notFinal := func() []string {
		var ids []string
		for i := range n {
			if st, ok := final(fmt.Sprintf("cl%03d", i)); !ok {
				ids = append(ids, fmt.Sprintf("cl%03d:%q", i, st.State))
			}
		}
		return ids
	}
	require.Eventually(t, func() bool { return len(notFinal()) == 0 }, 2*time.Minute, 250*time.Millisecond,
		"runs not final: %v", notFinal())

	starts := map[string]int{}
	for _, rt := range rts {
		for _, s := range rt.Starts() {
			starts[s.Labels[jail.LabelRunID]]++
		}
	}
	for i := range n {
		id := fmt.Sprintf("cl%03d", i)
		st, _ := final(id)
		require.Equal(t, messages.StateSucceeded, st.State, id)
		require.Equal(t, 1, starts[id], "run %s started %d times", id, starts[id])
	}
	// Every request left the work queue.
	require.Eventually(t, func() bool {
		s, err := js.Stream(context.Background(), messages.StreamRuns)
		if err != nil {
			return false
		}
		info, err := s.Info(context.Background())
		return err == nil && info.State.Msgs == 0
	}, 30*time.Second, 250*time.Millisecond)
	// One finished event per run.
	for i := range n {
		id := fmt.Sprintf("cl%03d", i)
		s, err := js.Stream(context.Background(), messages.StreamEvents)
		require.NoError(t, err)
		_, err = s.GetLastMsgForSubject(context.Background(), messages.SubjectEvents(id, messages.EventFinished))
		require.NoError(t, err, id)
	}
}
