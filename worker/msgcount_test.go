package worker_test

import (
	"context"
	"fmt"
	"sort"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest/msgcount"
)

// budget is the most messages (publishes and requests) a no-op run may
// cost, coordination on or off.
const budget = 10.0

// dispatcherSubmit submits through a dispatcher on nc, with a generated id
// (as most submitters leave it: a chosen one costs a state read, the
// id-in-use check).
func dispatcherSubmit(t testing.TB) func(nc *nats.Conn) msgcount.SubmitFunc {
	return func(nc *nats.Conn) msgcount.SubmitFunc {
		d, err := dispatcher.New(nc)
		require.NoError(t, err)
		return func(ctx context.Context, profile string, i int) (string, error) {
			return d.Submit(ctx, messages.RunRequest{Profile: profile, Prompt: "true", Labels: map[string]string{"i": fmt.Sprint(i)}})
		}
	}
}

// TestMessagesPerNoopRun counts the messages a no-op run costs on the
// server end to end, as a subscriber to ">" sees them: publishes and
// requests, and the
// replies to them besides (logged).
func TestMessagesPerNoopRun(t *testing.T) {
	t.Parallel()
	for _, profile := range []string{"shell", "nocoord"} {
		t.Run(profile, func(t *testing.T) {
			t.Parallel()
			c := msgcount.MessagesPerRun(t, profile, 10, dispatcherSubmit(t))
			keys := make([]string, 0, len(c.BySubject))
			for k := range c.BySubject {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				t.Logf("%-40s %5.1f per run", k, float64(c.BySubject[k])/10)
			}
			t.Logf("profile %s: %.1f messages per run, %.1f with replies", profile, c.PerRun, c.PerRun+c.RepliesPerRun)
			require.LessOrEqual(t, c.PerRun, budget, "messages per no-op run (profile %s)", profile)
		})
	}
}
