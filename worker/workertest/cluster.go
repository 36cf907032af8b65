package workertest

import (
	"fmt"
	"net/url"
	"strings"
	"syscall"
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
//
// Every node's client and route ports are reserved (ReservePort) before
// any node starts and stay reserved until the test ends: each node must
// know every route port before it starts, and a killed node restarts on
// its ports, so no test running beside this one can take a port in
// between.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{t: t}
	ports := make([]int, 2*n) // n client ports, then n route ports
	for i := range ports {
		ports[i] = ReservePort(t)
	}
	clientPorts, routePorts := ports[:n], ports[n:]
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
	// Registered after ReservePort's cleanups, so it runs before them: the
	// nodes are down before their ports are let go.
	t.Cleanup(func() {
		for _, s := range c.Nodes {
			if s != nil {
				s.Shutdown()
				s.WaitForShutdown()
			}
		}
	})
	for i := range n {
		c.startNode(i)
	}
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
	c.Nodes[i] = s // shut down by the cleanup, even when it never gets ready
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		c.t.Fatalf("node %d not ready", i)
	}
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

// ReservePort returns a free loopback TCP port that stays reserved until
// the test ends: a socket bound to it with SO_REUSEADDR that never
// listens. A listener that also sets SO_REUSEADDR (as every Go listener,
// nats-server's included, does) may bind the port beside it, at once or
// after an earlier listener on it closed; while it is bound the kernel
// never picks the port for anyone else's ephemeral bind or outgoing
// connection. Until a listener binds it, a connection to it is refused.
// (Listening on a port found free and closing it again, as StartCluster
// once did, lets a test running beside this one take the port in
// between.)
func ReservePort(t testing.TB) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatalf("reserve port: socket: %v", err)
	}
	syscall.CloseOnExec(fd)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		t.Fatalf("reserve port: SO_REUSEADDR: %v", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("reserve port: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("reserve port: getsockname: %v", err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}
