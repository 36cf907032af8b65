package coordination_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
)

// BenchmarkCoordRoundTrip measures one message from an agent to a peer agent
// through everything in between: MCP client → bridge → socket → Host →
// JetStream → Host → socket → bridge → MCP client, for a send followed by
// the peer's inbox call that returns it. Compare with
// BenchmarkRawNATSRequestReply, one bare NATS round trip.
func BenchmarkCoordRoundTrip(b *testing.B) {
	_, nc, _ := coordtest.Provisioned(b)
	h, err := coordination.NewHost(nc, coordination.Config{SendRate: -1, ReadRate: -1})
	require.NoError(b, err)
	dir := coordtest.SocketDir(b)
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		s, err := h.Serve(ctx, coordination.RunInfo{RunID: id, Group: "bench"}, coordtest.SocketPath(dir, id))
		require.NoError(b, err)
		b.Cleanup(func() { _ = s.Close(context.Background()) })
	}
	a := coordtest.Bridge(b, coordtest.SocketPath(dir, "a"))
	peer := coordtest.Bridge(b, coordtest.SocketPath(dir, "b"))
	sendArgs := map[string]any{"to": "b", "body": "ping"}
	inboxArgs := map[string]any{"wait_seconds": 5, "max": 1}

	b.ReportAllocs()
	for b.Loop() {
		res := coordtest.Call(b, a, "send", sendArgs)
		if res.IsError {
			b.Fatal(coordtest.Text(res))
		}
		got := coordtest.Decode[relay.InboxResponse](b, peer, "inbox", inboxArgs)
		if len(got.Messages) != 1 {
			b.Fatalf("inbox returned %d messages", len(got.Messages))
		}
	}
}

// BenchmarkRawNATSRequestReply is the baseline: one core NATS request and
// its reply between two connections to the same embedded server.
func BenchmarkRawNATSRequestReply(b *testing.B) {
	srv := coordtest.StartServer(b)
	responder := coordtest.Connect(b, srv)
	requester := coordtest.Connect(b, srv)
	sub, err := responder.Subscribe("bench.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	require.NoError(b, err)
	b.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(b, responder.Flush())
	payload := []byte("ping")

	b.ReportAllocs()
	for b.Loop() {
		if _, err := requester.Request("bench.echo", payload, 5*time.Second); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimRoundTrip measures one claim and its release by an agent,
// through the bridge, the socket and the Host's compare-and-set on the
// group's key, with a peer holding 16 claims in the group. Compare with
// BenchmarkRawKVUpdate, two bare compare-and-set writes.
func BenchmarkClaimRoundTrip(b *testing.B) {
	_, nc, _ := coordtest.Provisioned(b)
	h, err := coordination.NewHost(nc, coordination.Config{ClaimRate: -1, ReadRate: -1})
	require.NoError(b, err)
	dir := coordtest.SocketDir(b)
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		s, err := h.Serve(ctx, coordination.RunInfo{RunID: id, Group: "bench"}, coordtest.SocketPath(dir, id))
		require.NoError(b, err)
		b.Cleanup(func() { _ = s.Close(context.Background()) })
	}
	a := coordtest.Bridge(b, coordtest.SocketPath(dir, "a"))
	peer := coordtest.Bridge(b, coordtest.SocketPath(dir, "b"))
	var held []string
	for i := range 16 {
		held = append(held, fmt.Sprintf("pkg%d/**", i))
	}
	if res := coordtest.Call(b, peer, "claim", map[string]any{"paths": held, "reason": "bench"}); res.IsError {
		b.Fatal(coordtest.Text(res))
	}
	claimArgs := map[string]any{"paths": []string{"cmd/main.go"}, "reason": "bench"}
	releaseArgs := map[string]any{"paths": []string{"cmd/main.go"}}

	b.ReportAllocs()
	for b.Loop() {
		if res := coordtest.Call(b, a, "claim", claimArgs); res.IsError {
			b.Fatal(coordtest.Text(res))
		}
		if res := coordtest.Call(b, a, "release", releaseArgs); res.IsError {
			b.Fatal(coordtest.Text(res))
		}
	}
}

// BenchmarkRawKVUpdate is the claim's baseline: a read and a
// compare-and-set write of one key, twice (a claim and a release).
func BenchmarkRawKVUpdate(b *testing.B) {
	_, _, js := coordtest.Provisioned(b)
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, coordination.BucketClaims)
	require.NoError(b, err)
	_, err = kv.Put(ctx, "bench", []byte(`{"claims":[]}`))
	require.NoError(b, err)

	b.ReportAllocs()
	for b.Loop() {
		for range 2 {
			e, err := kv.Get(ctx, "bench")
			if err != nil {
				b.Fatal(err)
			}
			if _, err := kv.Update(ctx, "bench", e.Value(), e.Revision()); err != nil {
				b.Fatal(err)
			}
		}
	}
}
