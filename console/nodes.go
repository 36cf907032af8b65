package console

import (
	"fmt"
	"sort"
	"time"

	"github.com/jetcrew/jetcrew/dispatcher"
)

// nodeRow is one NATS server of a cluster on the overview, as the leaders
// of jetcrew's streams see it.
type nodeRow struct {
	// Name is the server's name.
	Name string
	// Down is set when a stream's leader reports the server offline and
	// no stream has it as leader.
	Down bool
	// Leads are the streams whose Raft leader it is.
	Leads []string
	// Behind says, for each stream whose copy on it is not caught up,
	// how far behind it is ("KV_jetcrew-runs: 12 ops behind").
	Behind []string
}

// clusterView is the overview's NATS nodes: nil on a single server.
type clusterView struct {
	Nodes []nodeRow
	// Leaderless are the streams without a leader now.
	Leaderless []string
	// Streams are the streams read (dispatcher.ClusterStreams that exist).
	Streams []string
}

// nodesView gathers the nodes of streams' cluster infos: nil when no
// stream is clustered (a single server shows no nodes).
func nodesView(streams []dispatcher.StreamNodes) *clusterView {
	clustered := false
	for _, s := range streams {
		clustered = clustered || s.Clustered
	}
	if !clustered {
		return nil
	}
	v := &clusterView{}
	byName := map[string]*nodeRow{}
	node := func(name string) *nodeRow {
		n := byName[name]
		if n == nil {
			n = &nodeRow{Name: name}
			byName[name] = n
		}
		return n
	}
	leaders := map[string]bool{}
	for _, s := range streams {
		v.Streams = append(v.Streams, s.Stream)
		if s.Leader == "" {
			v.Leaderless = append(v.Leaderless, s.Stream)
		} else {
			n := node(s.Leader)
			n.Leads = append(n.Leads, s.Stream)
			leaders[s.Leader] = true
		}
		for _, r := range s.Replicas {
			n := node(r.Name)
			switch {
			case r.Offline:
				n.Down = true
				n.Behind = append(n.Behind, fmt.Sprintf("%s: offline, last seen %s ago", s.Stream, r.Active.Round(time.Second)))
			case !r.Current || r.Lag > 0:
				n.Behind = append(n.Behind, fmt.Sprintf("%s: %d op(s) behind", s.Stream, r.Lag))
			}
		}
	}
	for name, n := range byName {
		if leaders[name] {
			n.Down = false
		}
		v.Nodes = append(v.Nodes, *n)
	}
	sort.Slice(v.Nodes, func(i, j int) bool { return v.Nodes[i].Name < v.Nodes[j].Name })
	return v
}
