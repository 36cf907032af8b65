package bridge_test

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination/bridge"
	"github.com/jetcrew/jetcrew/coordination/relay"
)

var update = flag.Bool("update", false, "rewrite golden files")

// connect runs the bridge in process over in-memory transports, relaying to
// a socket that does not exist, with no reconnect window.
func connect(t *testing.T) *mcp.ClientSession {
	t.Helper()
	return connectTo(t, relay.NewClientWith(filepath.Join(t.TempDir(), "none.sock"), relay.ClientOptions{}))
}

// connectTo runs the bridge in process over in-memory transports, relaying
// through c, which it closes when the test ends.
func connectTo(t *testing.T, c *relay.Client) *mcp.ClientSession {
	t.Helper()
	t.Cleanup(c.Close)
	st, ct := mcp.NewInMemoryTransports()
	srv := bridge.NewServer(c, bridge.Options{Version: "test"})
	ss, err := srv.Connect(context.Background(), st, nil)
	require.NoError(t, err)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "t"}, nil).Connect(context.Background(), ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cs.Close()
		_ = ss.Wait()
	})
	return cs
}

// TestToolsGolden pins what an agent sees: each tool's name, description and
// input and output schemas (testdata/tools.json; refresh with -update).
func TestToolsGolden(t *testing.T) {
	t.Parallel()
	cs := connect(t)
	res, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	got, err := json.MarshalIndent(res.Tools, "", "  ")
	require.NoError(t, err)
	got = append(got, '\n')
	path := filepath.Join("testdata", "tools.json")
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "golden file missing; run go test ./coordination/bridge -update")
	require.Equal(t, string(want), string(got))

	// Every input schema refuses fields it does not name (a forged "from").
	for _, tool := range res.Tools {
		b, err := json.Marshal(tool.InputSchema)
		require.NoError(t, err)
		var schema struct {
			AdditionalProperties *bool `json:"additionalProperties"`
		}
		require.NoError(t, json.Unmarshal(b, &schema))
		require.NotNil(t, schema.AdditionalProperties, tool.Name)
		require.False(t, *schema.AdditionalProperties, tool.Name)
	}
	require.Equal(t, "jetcrew", cs.InitializeResult().ServerInfo.Name)
}

func TestBridgeChecksBeforeRelaying(t *testing.T) {
	t.Parallel()
	cs := connect(t)
	for name, tt := range map[string]struct {
		tool string
		args map[string]any
		want string
	}{
		"oversize body": {"send", map[string]any{"to": "all", "body": string(make([]byte, relay.MaxBodyBytes+1))}, "largest allowed is 16384 bytes"},
		"bad recipient": {"send", map[string]any{"to": "g.x", "body": "hi"}, "not a run id"},
		"bad wait":      {"inbox", map[string]any{"wait_seconds": 99}, "wait_seconds 99 is out of range"},
		"unreachable":   {"status", map[string]any{}, "coordination unavailable: "},
	} {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tt.tool, Arguments: tt.args})
		require.NoError(t, err, name)
		require.True(t, res.IsError, name)
		require.Contains(t, res.Content[0].(*mcp.TextContent).Text, tt.want, name)
	}
}
