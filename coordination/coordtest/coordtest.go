// Package coordtest holds test helpers for code built on package
// coordination: an embedded nats-server per test with the coordination
// resources provisioned, short socket directories, and an in-process MCP
// client talking to a bridge. They are real code, usable from any test.
package coordtest

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/bridge"
	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

// StartServer starts an embedded nats-server with JetStream on a random
// loopback port, storing under t.TempDir(), and shuts it down when the test
// ends (Shutdown is safe twice, so a test may stop it earlier).
func StartServer(t testing.TB) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoSigs:    true,
		NoLog:     true,
	})
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("nats-server not ready")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// Connect connects to s with opts and closes the connection when the test
// ends.
func Connect(t testing.TB, s *server.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Provisioned starts a server (StartServer), connects to it and provisions
// the coordination resources (coordination.Provision, one replica).
func Provisioned(t testing.TB) (*server.Server, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	s := StartServer(t)
	nc := Connect(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := coordination.Provision(ctx, js, 1); err != nil {
		t.Fatalf("provision: %v", err)
	}
	return s, nc, js
}

// WaitLongPoll waits until an inbox call of run runID is parked on s: its
// inbox consumer holds a waiting pull request (the long poll of an inbox
// call that found nothing). It fails the test after 10 seconds.
func WaitLongPoll(t testing.TB, s *server.Server, runID string) {
	t.Helper()
	js, err := jetstream.New(Connect(t, s))
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := func() (*jetstream.ConsumerInfo, error) {
			cons, err := js.Consumer(ctx, coordination.StreamName, coordination.InboxName(runID))
			if err != nil {
				return nil, err
			}
			return cons.Info(ctx)
		}()
		cancel()
		if err == nil && info.NumWaiting > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no inbox call of run %s is waiting (last error: %v)", runID, err)
		}
	}
}

// SocketDir returns a new directory with a short path, removed when the test
// ends. Unix socket paths are limited to 107 bytes, which t.TempDir() can
// exceed for long test names.
func SocketDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "jc")
	if err != nil {
		t.Fatalf("socket dir: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// Bridge runs a bridge (bridge.NewServer) in process, relaying to
// socketPath, and returns an MCP client session connected to it. Both end
// with the test. Its relay client has no reconnect window: a call to a
// socket nobody serves fails at once, "coordination unavailable" (a test
// of the reconnect makes its own client: BridgeOn).
func Bridge(t testing.TB, socketPath string) *mcp.ClientSession {
	t.Helper()
	return BridgeWith(t, socketPath, bridge.Options{Version: "test"})
}

// BridgeWith is Bridge with the bridge's options.
func BridgeWith(t testing.TB, socketPath string, opts bridge.Options) *mcp.ClientSession {
	t.Helper()
	c := relay.NewClientWith(socketPath, relay.ClientOptions{})
	t.Cleanup(c.Close)
	return BridgeOn(t, c, opts)
}

// BridgeOn is BridgeWith relaying through c.
func BridgeOn(t testing.TB, c *relay.Client, opts bridge.Options) *mcp.ClientSession {
	t.Helper()
	st, ct := mcp.NewInMemoryTransports()
	srv := bridge.NewServer(c, opts)
	ctx := context.Background()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatalf("bridge connect: %v", err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "coordtest", Version: "test"}, nil)
	cs, err := client.Connect(ctx, ct, nil)
	if err != nil {
		t.Fatalf("client connect: %v", err)
	}
	t.Cleanup(func() {
		_ = cs.Close()
		_ = ss.Wait()
	})
	return cs
}

// Call calls tool with args and returns the result. A protocol error fails
// the test; a tool error does not (see Text and Decode).
func Call(t testing.TB, cs *mcp.ClientSession, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: protocol error: %v", tool, err)
	}
	return res
}

// Text returns the text of a result's content blocks, concatenated.
func Text(res *mcp.CallToolResult) string {
	var s string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			s += tc.Text
		}
	}
	return s
}

// Decode calls tool and decodes its structured output into a T, failing the
// test on a tool error.
func Decode[T any](t testing.TB, cs *mcp.ClientSession, tool string, args any) T {
	t.Helper()
	res := Call(t, cs, tool, args)
	if res.IsError {
		t.Fatalf("call %s: tool error: %s", tool, Text(res))
	}
	var v T
	b, err := json.Marshal(res.StructuredContent)
	if err == nil {
		err = json.Unmarshal(b, &v)
	}
	if err != nil {
		t.Fatalf("call %s: decode output: %v", tool, err)
	}
	return v
}

// SocketPath returns the socket path of run id in dir.
func SocketPath(dir, runID string) string {
	return filepath.Join(dir, runID+".sock")
}

// Group returns the group called name in the default pool, what a
// coordination.RunInfo without a pool joins.
func Group(name string) messages.GroupRef {
	return messages.GroupRef{Pool: messages.DefaultPool, Name: name}
}
