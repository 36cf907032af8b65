//go:build bench

package bench

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest/msgcount"
)

// msgcountRuns is how many no-op runs each count averages over.
const msgcountRuns = 50

// TestMessagesPerRun records what a no-op run costs on the server, end to
// end, as a subscriber to ">" sees it: publishes and requests
// per run with coordination on (the built-in shell profile) and off, and
// the replies to them. worker/msgcount_test.go holds the budget (10) in
// make test; this records the figures.
func TestMessagesPerRun(t *testing.T) {
	submit := func(nc *nats.Conn) msgcount.SubmitFunc {
		d, err := dispatcher.New(nc)
		require.NoError(t, err)
		return func(ctx context.Context, profile string, i int) (string, error) {
			return d.Submit(ctx, messages.RunRequest{Profile: profile, Prompt: "true", Labels: map[string]string{"i": fmt.Sprint(i)}})
		}
	}
	for _, p := range []struct{ profile, name, what string }{
		{"shell", "messages_per_noop_run", "built-in shell profile (coordination on)"},
		{"nocoord", "messages_per_noop_nocoord_run", "coordination off"},
	} {
		c := msgcount.MessagesPerRun(t, p.profile, msgcountRuns, submit)
		record(t, p.name, Figure{Value: c.PerRun, Unit: "msgs", Samples: msgcountRuns,
			What: "publishes and requests the server routes per no-op run, submit (generated id) to ack, as a subscriber to `>` sees them; " + p.what + "; one run at a time, fake runtime, worker heartbeat left out"})
		record(t, p.name+"_replies", Figure{Value: c.RepliesPerRun, Unit: "msgs", Samples: msgcountRuns,
			What: "the replies to those (PubAcks, KV and JetStream API answers on _INBOX subjects); " + p.what})
	}
}
