// Package leaktest names the goroutines of jetcrew's dependencies that may
// outlive a test through no fault of jetcrew's, so every package's TestMain
// lets through the same ones and nothing more.
package leaktest

import "go.uber.org/goleak"

// Known returns goleak options that ignore two goroutines, by their top
// function, for goleak.VerifyTestMain or goleak.VerifyNone.
//
// One is nats.go v1.55.0's: ObjectStore.Put publishes its chunks with
// PublishAsync on a private JetStream context and defers cleanupReplySub,
// which sets the publisher's status channel to nil; when that runs before
// the goroutine newAsyncReply started (resetPendingAcksOnReconnect) has read
// the channel, the goroutine waits on a nil channel for ever (seen once in
// CI after a workspace result upload). There is one per such Put.
//
// The other is nats-server v2.15.2's: a stream mirroring another
// (JETCREW_COORD_VIEW, which coordination.Provision creates) sets up its
// consumer from a goroutine that waits for the create's answer or 30
// seconds (srcConsumerWaitTime), and one may still wait when its server has
// shut down; it ends by itself.
func Known() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*stream).setupMirrorConsumer.func3"),
	}
}
