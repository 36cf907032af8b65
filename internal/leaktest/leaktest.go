// Package leaktest names the goroutines of jetcrew's dependencies that may
// outlive a test through no fault of jetcrew's, so every package's TestMain
// lets through the same ones and nothing more.
package leaktest

import "go.uber.org/goleak"

// Known returns goleak options that ignore four goroutines, by their top
// function, for goleak.VerifyTestMain or goleak.VerifyNone. None of them is
// jetcrew's, and a server or connection a test forgot to close still shows:
// it leaves many other goroutines (accept loops, readers) behind.
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
//
// The last two are nats-server v2.15.2's too: a stream's file store flushes
// its state from a goroutine (flushStreamStateLoop) that ends when the
// store is stopped, and every file store keeps the shared access-time
// ticker (ats.Register) running. In cmd/jetcrew's tests run three times
// over (go test -count=3 -race: in 5 runs of 8; never in 6 runs of
// each test file alone) one store was left running after its server shut
// down, with no other goroutine of that server left: a stream created from
// a JetStream API request the server was still serving while it shut
// down, its store never stopped. Which request it was is not known.
func Known() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*stream).setupMirrorConsumer.func3"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
	}
}
