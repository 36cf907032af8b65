//go:build bench

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
)

// breakdownSamples is how many samples each layer of TestCoordBreakdown
// takes, after coordWarmup.
const breakdownSamples = 1000

// TestCoordBreakdown splits TestCoordRoundTrip's sample (a send, then the
// peer's inbox returning it) into its layers, each measured on its own in
// the same run, and logs p50/p99 of each; it records nothing in
// results.json. The layers, outermost first:
//   - full: agent → stdio → bridge process → socket → Session → NATS, as
//     TestCoordRoundTrip;
//   - inproc: the same with the bridges in this process (coordtest.Bridge,
//     go-sdk over in-memory transports): full minus stdio and the processes;
//   - relay: relay.Client.Send and Inbox straight to the sessions' sockets:
//     HTTP over the unix socket, the worker's handlers, NATS;
//   - stubworker: stdio bridge processes whose socket is a stub answering
//     at once (no NATS): go-sdk JSON-RPC, stdio and the HTTP relay alone;
//   - stubrelay: relay.Client against the same stub: the HTTP relay alone;
//   - sdknoop: the go-sdk alone, client and server in this process over
//     in-memory transports, tools of the bridge's names and types that
//     answer at once: what two MCP tool calls cost before any relaying;
//   - rawjs: JetStream publish → fetch of one message (the floor of the
//     NATS part).
func TestCoordBreakdown(t *testing.T) {
	s, nc, _ := coordtest.Provisioned(t)
	h, err := coordination.NewHost(nc, coordination.Config{SendRate: -1, ReadRate: -1})
	require.NoError(t, err)
	dir := coordtest.SocketDir(t)
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		sess, err := h.Serve(ctx, coordination.RunInfo{RunID: id, Group: "bench"}, coordtest.SocketPath(dir, id))
		require.NoError(t, err)
		t.Cleanup(func() { _ = sess.Close(context.Background()) })
	}
	sendArgs := map[string]any{"to": "b", "body": "ping"}
	inboxArgs := map[string]any{"wait_seconds": 5, "max": 1}
	mcpPair := func(a, b *mcp.ClientSession) func() {
		return func() {
			res := coordtest.Call(t, a, "send", sendArgs)
			require.False(t, res.IsError, coordtest.Text(res))
			got := coordtest.Decode[relay.InboxResponse](t, b, "inbox", inboxArgs)
			require.Len(t, got.Messages, 1)
		}
	}
	relayPair := func(a, b *relay.Client, want int) func() {
		return func() {
			_, err := a.Send(ctx, relay.SendRequest{To: "b", Body: "ping"})
			require.NoError(t, err)
			got, err := b.Inbox(ctx, relay.InboxRequest{WaitSeconds: 5, Max: 1})
			require.NoError(t, err)
			require.Len(t, got.Messages, want)
		}
	}
	bridgeBin := binary(t, "jetcrew-bridge")
	stub := stubWorker(t, dir)
	var pidA, pidB int
	layers := []struct {
		name string
		one  func()
	}{
		{"full", mcpPair(stdioBridge(t, bridgeBin, coordtest.SocketPath(dir, "a"), &pidA), stdioBridge(t, bridgeBin, coordtest.SocketPath(dir, "b"), &pidB))},
		{"inproc", mcpPair(coordtest.Bridge(t, coordtest.SocketPath(dir, "a")), coordtest.Bridge(t, coordtest.SocketPath(dir, "b")))},
		{"relay", relayPair(relay.NewClient(coordtest.SocketPath(dir, "a")), relay.NewClient(coordtest.SocketPath(dir, "b")), 1)},
		{"stubworker", mcpPair(stdioBridge(t, bridgeBin, stub), stdioBridge(t, bridgeBin, stub))},
		{"stubrelay", relayPair(relay.NewClient(stub), relay.NewClient(stub), 1)},
		{"sdknoop", mcpPair(sdkNoop(t), sdkNoop(t))},
	}
	// Round robin: every layer sees the same load on a shared machine. The
	// full layer's bridges do nothing else, so their CPU over the run is
	// theirs per full sample.
	xs := make([][]float64, len(layers))
	var bridgeCPU time.Duration
	for i := range coordWarmup + breakdownSamples {
		if i == coordWarmup {
			bridgeCPU = -childCPU(t, pidA) - childCPU(t, pidB)
		}
		for j, l := range layers {
			t0 := time.Now()
			l.one()
			if i >= coordWarmup {
				xs[j] = append(xs[j], ms(time.Since(t0)))
			}
		}
	}
	bridgeCPU += childCPU(t, pidA) + childCPU(t, pidB)
	t.Logf("the two bridge processes: %.3f ms of CPU per full sample", ms(bridgeCPU)/breakdownSamples)
	for j, l := range layers {
		t.Logf("%-10s p50 %.3f ms  p99 %.3f ms", l.name, median(xs[j]), percentile(xs[j], 0.99))
	}
	raw := rawPublishFetch(t, coordtest.Connect(t, s), coordtest.Connect(t, s))
	t.Logf("%-10s p50 %.3f ms  p99 %.3f ms", "rawjs", median(raw), percentile(raw, 0.99))
}

// stdioBridge starts bin/jetcrew-bridge relaying to socket and returns an
// MCP client session speaking to it over stdio; both end with the test.
func stdioBridge(t *testing.T, bin, socket string, pids ...*int) *mcp.ClientSession {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), relay.EnvSocket+"="+socket, "JETCREW_BRIDGE_LOG=warn")
	cmd.Stderr = os.Stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "bench-agent", Version: "bench"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	for _, p := range pids {
		*p = cmd.Process.Pid
	}
	return cs
}

// childCPU returns the user and system CPU time process pid has used
// (/proc/<pid>/stat, clock ticks of 10 ms).
func childCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, err := strconv.Atoi(f[11])
	require.NoError(t, err)
	stime, err := strconv.Atoi(f[12])
	require.NoError(t, err)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// stubWorker serves the relay endpoints on a socket in dir with canned
// answers (a send's id, one inbox message) and returns the socket's path.
func stubWorker(t *testing.T, dir string) string {
	t.Helper()
	path := coordtest.SocketPath(dir, "stub")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	msg := relay.InboxResponse{Messages: []relay.Message{{ID: "1", From: "a", To: "b", Body: "ping", Time: time.Now().UTC()}}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+relay.PathHello, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("POST "+relay.PathSend, func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(relay.SendResponse{MessageID: "1"})
	})
	mux.HandleFunc("POST "+relay.PathInbox, func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(msg)
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }() // ends with Close below
	t.Cleanup(func() { _ = srv.Close() })
	return path
}

// sdkNoop returns an MCP client session to a go-sdk server in this process
// (in-memory transports) whose send and inbox tools take and return the
// bridge's types and answer at once; both end with the test.
func sdkNoop(t *testing.T) *mcp.ClientSession {
	t.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: "noop", Version: "bench"}, nil)
	msg := relay.InboxResponse{Messages: []relay.Message{{ID: "1", From: "a", To: "b", Body: "ping", Time: time.Now().UTC()}}}
	mcp.AddTool(srv, &mcp.Tool{Name: "send"}, func(context.Context, *mcp.CallToolRequest, relay.SendRequest) (*mcp.CallToolResult, relay.SendResponse, error) {
		return nil, relay.SendResponse{MessageID: "1"}, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "inbox"}, func(context.Context, *mcp.CallToolRequest, relay.InboxRequest) (*mcp.CallToolResult, relay.InboxResponse, error) {
		return nil, msg, nil
	})
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(context.Background(), st, nil)
	require.NoError(t, err)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench-agent", Version: "bench"}, nil).Connect(context.Background(), ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cs.Close()
		_ = ss.Wait()
	})
	return cs
}
