package bridge_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination/relay"
)

// dyingWorker answers status and send on a run's socket, but dies (closes
// the connection, no reply) under the first send of each body it sees.
type dyingWorker struct {
	mu    sync.Mutex
	sends map[string]int // body → sends received
}

func (d *dyingWorker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == relay.PathStatus {
		_ = json.NewEncoder(w).Encode(relay.Status{RunID: "r1", Group: "g", Peers: []relay.Peer{}})
		return
	}
	var req relay.SendRequest
	data, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(data, &req)
	d.mu.Lock()
	d.sends[req.Body]++
	n := d.sends[req.Body]
	d.mu.Unlock()
	if n == 1 {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
		return
	}
	_ = json.NewEncoder(w).Encode(relay.SendResponse{MessageID: "42", Duplicate: true})
}

func (d *dyingWorker) count(body string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sends[body]
}

// A send in flight when the worker died: without an idempotency key the
// agent gets a tool error saying the message may or may not have been sent
// and that it may call again, and the session goes on; with a key, the
// bridge sends it again itself and the agent gets the message id.
func TestSendCutInFlightIsARetryableToolError(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "jcb")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	d := &dyingWorker{sends: map[string]int{}}
	srv := &http.Server{Handler: d}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	cs := connectTo(t, relay.NewClientWith(sock, relay.ClientOptions{ReconnectWindow: 10 * time.Second}))
	ctx := context.Background()

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "send", Arguments: map[string]any{"to": "all", "body": "no key"}})
	require.NoError(t, err, "a tool error, not a protocol error")
	require.True(t, res.IsError)
	text := res.Content[0].(*mcp.TextContent).Text
	t.Log(text)
	require.True(t, strings.HasPrefix(text, "coordination interrupted: the worker went away while this call was in flight"), text)
	require.Contains(t, text, "it may or may not have taken effect; check (status, inbox, claims) and call again if it did not")
	require.Equal(t, 1, d.count("no key"), "not sent again by the bridge")

	// The session goes on.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "status", Arguments: map[string]any{}})
	require.NoError(t, err)
	require.False(t, res.IsError, res.Content)

	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "send", Arguments: map[string]any{"to": "all", "body": "keyed", "idempotency_key": "k1"}})
	require.NoError(t, err)
	require.False(t, res.IsError, res.Content)
	require.Equal(t, 2, d.count("keyed"), "sent again by the bridge")
	var out relay.SendResponse
	b, err := json.Marshal(res.StructuredContent)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &out))
	require.Equal(t, relay.SendResponse{MessageID: "42", Duplicate: true}, out)
}
