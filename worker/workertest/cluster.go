package workertest

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Cluster is a JetStream cluster of nats-server nodes embedded in the test
// process, on loopback ports chosen at start and kept across restarts.
type Cluster struct {
	t     testing.TB
	opts  []*server.Options
	Nodes []*server.Server
}

// StartCluster starts an n-node JetStream cluster on loopback and shuts it
// down when the test ends. It fails the test when the cluster has no
// JetStream meta leader within 20 seconds.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{t: t}
	clientPorts, routePorts := freePorts(t, n), freePorts(t, n)
	var routes []*url.URL
	for _, p := range routePorts {
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	for i := range n {
		c.opts = append(c.opts, &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       clientPorts[i],
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoSigs:     true,
			NoLog:      true,
			Cluster:    server.ClusterOpts{Name: "jetcrew-test", Host: "127.0.0.1", Port: routePorts[i]},
			Routes:     routes,
		})
	}
	c.Nodes = make([]*server.Server, n)
	for i := range n {
		c.startNode(i)
	}
	t.Cleanup(func() {
		for _, s := range c.Nodes {
			if s != nil {
				s.Shutdown()
				s.WaitForShutdown()
			}
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range c.Nodes {
			if s.JetStreamIsLeader() {
				return c
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("cluster: no JetStream meta leader")
	return nil
}

func (c *Cluster) startNode(i int) {
	c.t.Helper()
	o := *c.opts[i]
	s, err := server.NewServer(&o)
	if err != nil {
		c.t.Fatalf("node %d: %v", i, err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		c.t.Fatalf("node %d not ready", i)
	}
	c.Nodes[i] = s
}

// URLs returns every node's client URL, comma separated, for nats.Connect.
func (c *Cluster) URLs() string {
	var us []string
	for _, o := range c.opts {
		us = append(us, fmt.Sprintf("nats://127.0.0.1:%d", o.Port))
	}
	return strings.Join(us, ",")
}

// Kill shuts node i down abruptly (its store survives for Restart).
func (c *Cluster) Kill(i int) {
	c.Nodes[i].Shutdown()
	c.Nodes[i].WaitForShutdown()
}

// Restart starts node i again on the same ports and store.
func (c *Cluster) Restart(i int) { c.startNode(i) }

func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ls []net.Listener
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("free port: %v", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		_ = l.Close()
	}
	return ports
}
