package budgetkv_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/internal/budgetkv"
	"github.com/jetcrew/jetcrew/messages"
)

// Two writers (each its own connection, as two workers) adding to one key
// at once lose no addition: the sum is exact to the token, the request and
// the cent.
func TestAddRacingWritersLoseNothing(t *testing.T) {
	t.Parallel()
	s := coordtest.StartServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var kvs []jetstream.KeyValue
	for range 2 {
		js, err := jetstream.New(coordtest.Connect(t, s))
		require.NoError(t, err)
		kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: messages.BucketBudgets, History: 1})
		require.NoError(t, err)
		kvs = append(kvs, kv)
	}
	const each = 200
	key := messages.BudgetKey(messages.BudgetScopeGroup, "g1", time.Hour, time.Now())
	var wg sync.WaitGroup
	for w := range 2 {
		for range 4 { // four goroutines per writer, as concurrent runs
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each / 4 {
					_, err := budgetkv.Add(ctx, kvs[w], key, messages.BudgetSpend{CostUSD: 0.25, OutputTokens: 7, Requests: 1})
					if err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	got, rev, err := budgetkv.Get(ctx, kvs[0], key)
	require.NoError(t, err)
	require.Equal(t, messages.BudgetSpend{CostUSD: 0.25 * 2 * each, OutputTokens: 7 * 2 * each, Requests: 2 * each}, got)
	require.EqualValues(t, 2*each, rev, "one write per addition: every conflict was retried, none overwrote")

	missing, rev, err := budgetkv.Get(ctx, kvs[1], "group.none.0-60")
	require.NoError(t, err)
	require.Zero(t, missing)
	require.Zero(t, rev)
}

// BudgetKey names one key per window, the same on every worker.
func TestBudgetKeyWindows(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(7200, 0)
	require.Equal(t, "pool.default.7200-3600", messages.BudgetKey(messages.BudgetScopePool, "default", time.Hour, t0))
	require.Equal(t, "pool.default.7200-3600", messages.BudgetKey(messages.BudgetScopePool, "default", time.Hour, t0.Add(59*time.Minute)))
	require.Equal(t, "pool.default.10800-3600", messages.BudgetKey(messages.BudgetScopePool, "default", time.Hour, t0.Add(time.Hour)))
	require.Equal(t, "grant.run.r1", messages.GrantKey(messages.BudgetScopeRun, "r1"))
}
