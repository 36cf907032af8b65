package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// ClusterStreams are the streams StreamNodes reads: the run requests, the
// run states (the jetcrew-runs bucket's stream), the events and the dead
// letters. Every role that reads the console may read their info
// (STREAM.INFO; package roles).
var ClusterStreams = []string{messages.StreamRuns, "KV_" + messages.BucketRuns, messages.StreamEvents, messages.StreamFailed}

// StreamNodes is where one stream's copies live, as its stream info's
// cluster part says (jetstream.ClusterInfo).
type StreamNodes struct {
	// Stream is the stream's name.
	Stream string
	// Clustered is false on a single server (the stream has no Raft
	// group): then Leader is that server's name and Replicas is empty.
	Clustered bool
	// Leader is the server name of the stream's Raft leader; empty while
	// the stream has none (an election, a lost quorum).
	Leader string
	// Replicas are the stream's other copies, as the leader sees them.
	Replicas []Replica
}

// Replica is one follower copy of a stream (jetstream.PeerInfo).
type Replica struct {
	// Name is the server's name.
	Name string
	// Current is true when the copy is caught up with the leader.
	Current bool
	// Offline is true when the group has not heard from the server
	// recently: the node is down or cut off.
	Offline bool
	// Active is how long ago the leader last heard from it.
	Active time.Duration
	// Lag is how many operations the copy is behind the leader.
	Lag uint64
}

// StreamNodes returns the cluster part of the info of every stream of
// ClusterStreams that exists, in that order: one request per stream. A
// stream that does not exist is left out; the first other error is
// returned beside what was read.
func (f *Fleet) StreamNodes(ctx context.Context) ([]StreamNodes, error) {
	var (
		out   []StreamNodes
		first error
	)
	for _, name := range ClusterStreams {
		s, err := f.js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			if first == nil {
				first = fmt.Errorf("stream nodes: stream %s: %w", name, classify(err))
			}
			continue
		}
		out = append(out, nodesOf(name, s.CachedInfo().Cluster))
	}
	return out, first
}

// nodesOf turns stream name's cluster info (nil when the server sent
// none) into a StreamNodes.
func nodesOf(name string, ci *jetstream.ClusterInfo) StreamNodes {
	sn := StreamNodes{Stream: name}
	if ci == nil {
		return sn
	}
	sn.Clustered, sn.Leader = ci.RaftGroup != "", ci.Leader
	for _, p := range ci.Replicas {
		if p == nil {
			continue
		}
		sn.Replicas = append(sn.Replicas, Replica{Name: p.Name, Current: p.Current, Offline: p.Offline, Active: p.Active, Lag: p.Lag})
	}
	return sn
}
