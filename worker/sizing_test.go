package worker

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

func TestSizingWarnings(t *testing.T) {
	t.Parallel()
	info := func(maxAck, numAck, maxWait, numWait int) *jetstream.ConsumerInfo {
		return &jetstream.ConsumerInfo{
			Config:        jetstream.ConsumerConfig{MaxAckPending: maxAck, MaxWaiting: maxWait},
			NumAckPending: numAck,
			NumWaiting:    numWait,
		}
	}
	tests := []struct {
		name        string
		concurrency int
		info        *jetstream.ConsumerInfo
		n           int      // warnings expected
		want        []string // substrings of the warnings, joined
	}{
		{"defaults fit", 4, info(1024, 0, 512, 0), 0, nil},
		{"exactly at both caps", 512, info(512, 0, 512, 0), 0, nil},
		{"no info", 4, nil, 0, nil},
		{"unlimited (0)", 5000, info(0, 0, 0, 0), 0, nil},
		{"beyond max ack pending", 8, info(4, 0, 512, 0), 1, []string{"concurrency 8 exceeds the pool consumer's max ack pending 4", "at least 4 slots"}},
		{"pool busy", 8, info(1024, 1020, 512, 0), 1, []string{"already holds 1020 of its consumer's max ack pending 1024, leaving 4"}},
		{"pool over the cap", 8, info(10, 12, 512, 0), 1, []string{"leaving 0 for this worker's 8 slots"}},
		{"beyond max waiting", 600, info(1024, 0, 512, 0), 1, []string{"concurrency 600 exceeds the pool consumer's max waiting 512"}},
		{"waiting pulls", 16, info(1024, 0, 512, 500), 1, []string{"already keep 500 pull requests waiting"}},
		{"both", 2000, info(1024, 0, 512, 0), 2, []string{"max ack pending 1024", "max waiting 512"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := sizingWarnings(tt.concurrency, tt.info)
			require.Len(t, got, tt.n, "%q", got)
			for _, w := range tt.want {
				require.Contains(t, strings.Join(got, "\n"), w)
			}
		})
	}
}

// warnSizing reads the consumer as the server has it and logs a warning for
// a worker whose concurrency exceeds its max ack pending.
func TestWarnSizingLogs(t *testing.T) {
	t.Parallel()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := Provision(ctx, js, ProvisionConfig{MaxAckPending: 3})
	require.NoError(t, err)

	var buf bytes.Buffer
	w := &Worker{cfg: Config{Concurrency: 5}, cons: cons, log: zerolog.New(&buf)}
	w.warnSizing(ctx)
	require.Contains(t, buf.String(), `"level":"warn"`)
	require.Contains(t, buf.String(), "concurrency 5 exceeds the pool consumer's max ack pending 3")
	require.Contains(t, buf.String(), `"max_ack_pending":3`)

	buf.Reset()
	w.cfg.Concurrency = 3
	w.warnSizing(ctx)
	require.Empty(t, buf.String())
}
