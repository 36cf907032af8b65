//go:build bench

package bench

import (
	"context"
	"os"
	"os/exec"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
)

// Samples of the coordination round trip and of its baseline, after
// coordWarmup.
const (
	coordSamples = 400
	rawSamples   = 4000
	coordWarmup  = 20
)

// TestCoordRoundTrip measures one message from an agent to a peer through
// two real bridge processes (bin/jetcrew-bridge, spoken to over stdio as an
// agent's CLI does): agent A's MCP `send` → bridge A → unix socket → Host →
// JETCREW_COORD → Host → unix socket → bridge B → agent B's MCP `inbox`
// returning it. One sample is the send call plus the peer's inbox call that
// returns the message, back to back. The baseline is a bare JetStream publish
// and a fetch of that message on the same embedded server (the path stores
// the message, so that is its floor); a core NATS request/reply is recorded
// beside it.
func TestCoordRoundTrip(t *testing.T) {
	s, nc, _ := coordtest.Provisioned(t)
	h, err := coordination.NewHost(nc, coordination.Config{SendRate: -1, ReadRate: -1})
	require.NoError(t, err)
	sessions := benchBridges(t, h)
	a, peer := sessions["a"], sessions["b"]
	sendArgs := map[string]any{"to": "b", "body": "ping"}
	inboxArgs := map[string]any{"wait_seconds": 5, "max": 1}

	var rtts []float64
	f, err := os.Create("coord.cpu.prof")
	require.NoError(t, err)
	defer f.Close()
	for i := range coordWarmup + coordSamples {
		if i == coordWarmup {
			require.NoError(t, pprof.StartCPUProfile(f))
		}
		t0 := time.Now()
		res := coordtest.Call(t, a, "send", sendArgs)
		require.False(t, res.IsError, coordtest.Text(res))
		got := coordtest.Decode[relay.InboxResponse](t, peer, "inbox", inboxArgs)
		d := time.Since(t0)
		require.Len(t, got.Messages, 1)
		if i >= coordWarmup {
			rtts = append(rtts, ms(d))
		}
	}
	pprof.StopCPUProfile()

	rawJS := rawPublishFetch(t, coordtest.Connect(t, s), coordtest.Connect(t, s))
	const rawJSWhat = "bare JetStream: one connection publishes (PubAck awaited) to a file stream, another fetches that message with a pull consumer (fetch 1) and acks it; same embedded server, 4-byte payload"
	record(t, "raw_js_pubfetch_rtt_p50_ms", Figure{Value: round(median(rawJS), 3), Unit: "ms", Samples: len(rawJS), What: rawJSWhat})
	record(t, "raw_js_pubfetch_rtt_p99_ms", Figure{Value: round(percentile(rawJS, 0.99), 3), Unit: "ms", Samples: len(rawJS), What: rawJSWhat})
	raw := rawRequestReply(t, coordtest.Connect(t, s), coordtest.Connect(t, s))
	const rawWhat = "bare core NATS request → reply between two connections to the same embedded server (4-byte payload)"
	record(t, "raw_nats_rtt_p50_ms", Figure{Value: round(median(raw), 3), Unit: "ms", Samples: len(raw), What: rawWhat})
	record(t, "raw_nats_rtt_p99_ms", Figure{Value: round(percentile(raw, 0.99), 3), Unit: "ms", Samples: len(raw), What: rawWhat})
	const what = "agent A `send` → bridge process → socket → worker Host → JETCREW_COORD → Host → socket → bridge process → agent B `inbox` returns it (two MCP calls over stdio, back to back)"
	// The path persists the message, so its fair floor is a JetStream
	// publish → fetch, not a core request/reply.
	record(t, "coord_rtt_p50_ms", Figure{Value: round(median(rtts), 3), Unit: "ms", Baseline: "raw_js_pubfetch_rtt_p50_ms", Samples: len(rtts), What: what})
	record(t, "coord_rtt_p99_ms", Figure{Value: round(percentile(rtts, 0.99), 3), Unit: "ms", Baseline: "raw_js_pubfetch_rtt_p99_ms", Samples: len(rtts), What: what})
}

// rawPublishFetch returns rawSamples round trips, in ms after coordWarmup,
// of one message published by pub to a file stream of its own and fetched
// (fetch 1) and acked by sub through a durable pull consumer: the JetStream
// floor under a coordination send and inbox.
func rawPublishFetch(t *testing.T, pubConn, subConn *nats.Conn) []float64 {
	t.Helper()
	ctx := context.Background()
	pub, err := jetstream.New(pubConn)
	require.NoError(t, err)
	sub, err := jetstream.New(subConn)
	require.NoError(t, err)
	_, err = pub.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_PUBFETCH", Subjects: []string{"bench.pubfetch"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	cons, err := sub.CreateOrUpdateConsumer(ctx, "BENCH_PUBFETCH", jetstream.ConsumerConfig{Durable: "reader", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	payload := []byte("ping")
	var out []float64
	for i := range coordWarmup + rawSamples {
		t0 := time.Now()
		_, err := pub.Publish(ctx, "bench.pubfetch", payload)
		require.NoError(t, err)
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		n := 0
		for m := range batch.Messages() {
			require.NoError(t, m.Ack())
			n++
		}
		d := time.Since(t0)
		require.NoError(t, batch.Error())
		require.Equal(t, 1, n)
		if i >= coordWarmup {
			out = append(out, ms(d))
		}
	}
	return out
}

// rawRequestReply returns rawSamples round trips of a core NATS request
// from requester to an echo responder, in ms, after coordWarmup.
func rawRequestReply(t *testing.T, responder, requester *nats.Conn) []float64 {
	t.Helper()
	sub, err := responder.Subscribe("bench.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	require.NoError(t, err)
	defer sub.Unsubscribe()
	require.NoError(t, responder.Flush())
	payload := []byte("ping")
	var out []float64
	for i := range coordWarmup + rawSamples {
		t0 := time.Now()
		_, err := requester.Request("bench.echo", payload, 5*time.Second)
		d := time.Since(t0)
		require.NoError(t, err)
		if i >= coordWarmup {
			out = append(out, ms(d))
		}
	}
	return out
}

// benchBridges serves runs "a" and "b" of group "bench" on h and connects
// an MCP client to each through a real bridge process (bin/jetcrew-bridge
// over stdio, as an agent's CLI speaks to it). It returns the client
// sessions by run id; everything is closed when the test ends.
func benchBridges(t *testing.T, h *coordination.Host) map[string]*mcp.ClientSession {
	t.Helper()
	dir := coordtest.SocketDir(t)
	ctx := context.Background()
	bridgeBin := binary(t, "jetcrew-bridge")
	sessions := map[string]*mcp.ClientSession{}
	for _, id := range []string{"a", "b"} {
		sess, err := h.Serve(ctx, coordination.RunInfo{RunID: id, Group: "bench"}, coordtest.SocketPath(dir, id))
		require.NoError(t, err)
		t.Cleanup(func() { _ = sess.Close(context.Background()) })
		cmd := exec.Command(bridgeBin)
		cmd.Env = append(os.Environ(), relay.EnvSocket+"="+coordtest.SocketPath(dir, id), "JETCREW_BRIDGE_LOG=warn")
		cmd.Stderr = os.Stderr
		client := mcp.NewClient(&mcp.Implementation{Name: "bench-agent-" + id, Version: "bench"}, nil)
		cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = cs.Close() })
		sessions[id] = cs
	}
	return sessions
}
