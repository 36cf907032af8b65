//go:build bench

package bench

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
)

// Samples of the claim round trip and of its baseline, after claimWarmup.
const (
	claimSamples = 300
	casSamples   = 2000
	claimWarmup  = 20
)

// TestClaimRoundTrip measures one `claim` call of an agent through a real
// bridge process (bin/jetcrew-bridge over stdio, as an agent's CLI speaks to
// it): MCP call → bridge → unix socket → worker Host → the group's key in
// jetcrew-coord-claims read, the holders' presence read, compare-and-set
// write → the answer back. The group has one other run holding one claim,
// so the call checks overlap and reads that holder's presence. Each sample
// claims a fresh pattern; a release (untimed) follows it. The baseline is a
// bare key-value compare-and-set (an Update at the revision last written)
// on the same embedded server, from the same process.
func TestClaimRoundTrip(t *testing.T) {
	s, nc, _ := coordtest.Provisioned(t)
	h, err := coordination.NewHost(nc, coordination.Config{ClaimRate: -1, ReadRate: -1})
	require.NoError(t, err)
	sessions := benchBridges(t, h)
	a := sessions["a"]
	res := coordtest.Call(t, sessions["b"], "claim", map[string]any{"paths": []string{"docs"}, "reason": "the other run"})
	require.False(t, res.IsError, coordtest.Text(res))

	var rtts []float64
	for i := range claimWarmup + claimSamples {
		args := map[string]any{"paths": []string{"src/pkg" + time.Now().Format("150405.000000")}, "reason": "bench"}
		t0 := time.Now()
		got := coordtest.Decode[relay.ClaimResponse](t, a, "claim", args)
		d := time.Since(t0)
		require.Len(t, got.Claims, 1)
		rel := coordtest.Call(t, a, "release", map[string]any{"paths": args["paths"]})
		require.False(t, rel.IsError, coordtest.Text(rel))
		if i >= claimWarmup {
			rtts = append(rtts, ms(d))
		}
	}

	cas := bareCAS(t, coordtest.Connect(t, s))
	const casWhat = "bare key-value compare-and-set: Update of one key at the revision last written (a ~200-byte value), file bucket, history 1; same embedded server"
	record(t, "raw_kv_cas_p50_ms", Figure{Value: round(median(cas), 3), Unit: "ms", Samples: len(cas), What: casWhat})
	record(t, "raw_kv_cas_p99_ms", Figure{Value: round(percentile(cas, 0.99), 3), Unit: "ms", Samples: len(cas), What: casWhat})
	const what = "agent `claim` of one fresh pattern → bridge process → socket → worker Host → the group's claims read, the other holder's presence read, compare-and-set write → answer (one MCP call over stdio; the group holds one other run's claim)"
	record(t, "claim_rtt_p50_ms", Figure{Value: round(median(rtts), 3), Unit: "ms", Baseline: "raw_kv_cas_p50_ms", Samples: len(rtts), What: what})
	record(t, "claim_rtt_p99_ms", Figure{Value: round(percentile(rtts, 0.99), 3), Unit: "ms", Baseline: "raw_kv_cas_p99_ms", Samples: len(rtts), What: what})
}

// bareCAS returns casSamples compare-and-set round trips, in ms after
// claimWarmup: kv.Update of one key at the revision the last write
// returned, on a bucket configured as jetcrew-coord-claims is.
func bareCAS(t *testing.T, nc *nats.Conn) []float64 {
	t.Helper()
	ctx := context.Background()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bench-cas", History: 1, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	value := []byte(`{"claims":[{"pattern":"src/pkg","run_id":"a","reason":"bench","since":"2026-12-07T00:00:00Z","session":"ABCDEFGHIJKLMNOPQRSTUVWXYZ"}]}`)
	rev, err := kv.Create(ctx, "bench", value)
	require.NoError(t, err)
	var out []float64
	for i := range claimWarmup + casSamples {
		t0 := time.Now()
		rev, err = kv.Update(ctx, "bench", value, rev)
		d := time.Since(t0)
		require.NoError(t, err)
		if i >= claimWarmup {
			out = append(out, ms(d))
		}
	}
	return out
}
