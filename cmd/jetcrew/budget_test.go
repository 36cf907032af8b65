package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/internal/budgetkv"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// jetcrew budget RUN grants only a run that can still use it: a running
// run, or a queued one (its worker applies the grant when it starts). A run
// that has ended, or a run id known nowhere, is told so, exit 1, and
// nothing is granted.
func TestBudgetSaysWhenTheRunIsNotRunning(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	startWorker(t, s, "--id", "budget-worker")
	url := s.ClientURL()
	js, err := jetstream.New(workertest.Connect(t, s))
	require.NoError(t, err)
	kv, err := js.KeyValue(context.Background(), messages.BucketBudgets)
	require.NoError(t, err)
	granted := func(id string) messages.BudgetSpend {
		g, _, err := budgetkv.Get(context.Background(), kv, messages.GrantKey(messages.BudgetScopeRun, id))
		require.NoError(t, err)
		return g
	}

	code, _, stderr := cli(t, url, "submit", "--wait", "--id", "ended", "out done")
	require.Equal(t, 0, code, stderr)
	code, stdout, stderr := cli(t, url, "budget", "ended", "+1")
	require.Equal(t, 1, code, stdout)
	require.Contains(t, stderr, "run ended has ended (succeeded): nothing granted\n")
	require.Zero(t, granted("ended"))

	code, stdout, stderr = cli(t, url, "budget", "nosuchrun", "+1")
	require.Equal(t, 1, code, stdout)
	require.Contains(t, stderr, "run nosuchrun is unknown (no state, no request waiting in JETCREW_RUNS): nothing granted\n")
	require.Zero(t, granted("nosuchrun"))

	code, _, stderr = cli(t, url, "submit", "--pool", "nobody", "--id", "waits", "out never")
	require.Equal(t, 0, code, stderr)
	code, stdout, stderr = cli(t, url, "budget", "waits", "+1")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "run waits: granted $1.0000")
	require.Contains(t, stdout, "the run is queued: its worker applies the grant when it starts")
	require.Equal(t, 1.0, granted("waits").CostUSD)

	code, _, stderr = cli(t, url, "submit", "--id", "busy", "sleep 30s")
	require.Equal(t, 0, code, stderr)
	require.Eventually(t, func() bool {
		_, out, _ := cli(t, url, "status", "busy")
		return strings.Contains(out, "running")
	}, 20*time.Second, 50*time.Millisecond)
	code, stdout, stderr = cli(t, url, "budget", "busy", "+2.5")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "run busy: granted $2.5000")
	require.NotContains(t, stdout, "queued")
	require.Equal(t, 2.5, granted("busy").CostUSD)
	code, _, stderr = cli(t, url, "cancel", "busy")
	require.Equal(t, 0, code, stderr)
}
