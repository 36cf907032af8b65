package console

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

func TestNodesView(t *testing.T) {
	t.Parallel()
	require.Nil(t, nodesView(nil))
	require.Nil(t, nodesView([]dispatcher.StreamNodes{{Stream: "JETCREW_RUNS", Leader: "solo"}}), "a single server shows no nodes")

	v := nodesView([]dispatcher.StreamNodes{
		{Stream: "JETCREW_RUNS", Clustered: true, Leader: "n1", Replicas: []dispatcher.Replica{
			{Name: "n2", Current: true}, {Name: "n3", Offline: true, Active: 42 * time.Second}}},
		{Stream: "KV_jetcrew-runs", Clustered: true, Leader: "n2", Replicas: []dispatcher.Replica{
			{Name: "n1", Current: false, Lag: 12}, {Name: "n3", Offline: true}}},
		{Stream: "JETCREW_EVENTS", Clustered: true},
	})
	require.NotNil(t, v)
	require.Equal(t, []string{"JETCREW_EVENTS"}, v.Leaderless)
	require.Equal(t, []string{"JETCREW_RUNS", "KV_jetcrew-runs", "JETCREW_EVENTS"}, v.Streams)
	require.Equal(t, []nodeRow{
		{Name: "n1", Leads: []string{"JETCREW_RUNS"}, Behind: []string{"KV_jetcrew-runs: 12 op(s) behind"}},
		{Name: "n2", Leads: []string{"KV_jetcrew-runs"}},
		{Name: "n3", Down: true, Behind: []string{"JETCREW_RUNS: offline, last seen 42s ago", "KV_jetcrew-runs: offline, last seen 0s ago"}},
	}, v.Nodes)
}

// On an embedded three-node cluster with jetcrew's streams at three
// replicas, the overview lists the three nodes, each up, every stream led
// by one of them; a node shut down shows down.
func TestOverviewClusterNodes(t *testing.T) {
	t.Parallel()
	cl := workertest.StartCluster(t, 3)
	nc, err := nats.Connect(cl.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, err := worker.Provision(ctx, js, worker.ProvisionConfig{Replicas: 3})
		return err == nil
	}, 30*time.Second, 200*time.Millisecond)
	d, err := dispatcher.New(nc)
	require.NoError(t, err)

	view := func() *clusterView {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		sn, err := d.StreamNodes(ctx)
		if err != nil {
			return nil
		}
		return nodesView(sn)
	}
	require.Eventually(t, func() bool {
		v := view()
		if v == nil || len(v.Nodes) != 3 || len(v.Leaderless) > 0 || len(v.Streams) != len(dispatcher.ClusterStreams) {
			return false
		}
		for _, n := range v.Nodes {
			if n.Down || len(n.Behind) > 0 {
				return false
			}
		}
		return true
	}, 30*time.Second, 100*time.Millisecond, "three nodes up, every stream led and caught up")

	// Shut down a node that leads no stream of ours, so the others keep
	// answering at once, and it shows down.
	v := view()
	leads := map[string]bool{}
	for _, n := range v.Nodes {
		leads[n.Name] = len(n.Leads) > 0
	}
	victim := -1
	for i, s := range cl.Nodes {
		if !leads[s.Name()] {
			victim = i
			break
		}
	}
	if victim < 0 {
		victim = 2
	}
	name := cl.Nodes[victim].Name()
	cl.Kill(victim)
	require.Eventually(t, func() bool {
		v := view()
		if v == nil {
			return false
		}
		for _, n := range v.Nodes {
			if n.Name == name {
				return n.Down
			}
		}
		return false
	}, 60*time.Second, 250*time.Millisecond, "the node shut down shows down")
}
