package workertest

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// WaitWorkerReady waits up to timeout until a worker serves pool: its
// consumer exists on JETCREW_RUNS and a worker announced itself in the
// workers bucket (the first heartbeat comes after the consumer; a waiting
// submit before it says no live worker serves the pool and exits 1).
// msgAndArgs describe the failure, as in require.Eventually.
func WaitWorkerReady(t *testing.T, js jetstream.JetStream, pool string, timeout time.Duration, msgAndArgs ...any) {
	t.Helper()
	require.Eventually(t, func() bool {
		if _, err := js.Consumer(t.Context(), messages.StreamRuns, messages.ConsumerName(pool)); err != nil {
			return false
		}
		kv, err := js.KeyValue(t.Context(), messages.BucketWorkers)
		if err != nil {
			return false
		}
		keys, err := kv.Keys(t.Context())
		return err == nil && len(keys) > 0
	}, timeout, 20*time.Millisecond, msgAndArgs...)
}
