package worker_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them: every
// service, run, watchdog and container stop the worker starts must end by
// the time Stop returns (and each test's server and connection are closed
// by its cleanup).
//
// One goroutine of nats.go v1.55.0 is let through: ObjectStore.Put
// publishes its chunks with PublishAsync on a private JetStream context and
// defers cleanupReplySub, which sets the publisher's status channel to nil;
// when that runs before the goroutine newAsyncReply started
// (resetPendingAcksOnReconnect) has read the channel, the goroutine waits on
// a nil channel for ever (seen once in CI after a workspace result upload).
// It is nats.go's, one per such Put, and not the worker's to end.
//
// So is one of nats-server v2.15.2's: a stream mirroring another
// (JETCREW_COORD_VIEW, which coordination.Provision creates) sets up its
// consumer from a goroutine that waits for the create's answer or 30
// seconds (srcConsumerWaitTime), and one may still wait when its server
// has shut down; it ends by itself.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*stream).setupMirrorConsumer.func3"))
}
