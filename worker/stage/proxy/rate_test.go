package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
)

// The bucket: full when new, refilled at the rate per minute up to one
// minute's worth, a request taking one request and its tokens; one it
// cannot give waits as long as the refill takes.
func TestRateTake(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	rpm := profile.EgressRate{RequestsPerMinute: 60}
	tpm := profile.EgressRate{TokensPerMinute: 6000}
	for _, c := range []struct {
		name  string
		r     profile.EgressRate
		b     rateBucket
		fresh bool
		need  int64
		want  rateBucket
		wait  time.Duration
	}{
		{"fresh is full", rpm, rateBucket{}, true, 0, rateBucket{Requests: 59, AtMS: now.UnixMilli()}, 0},
		{"empty waits a second", rpm, rateBucket{AtMS: now.UnixMilli()}, false, 0, rateBucket{AtMS: now.UnixMilli()}, time.Second},
		{"refilled half", rpm, rateBucket{Requests: 0.5, AtMS: now.Add(-500 * time.Millisecond).UnixMilli()}, false, 0, rateBucket{Requests: 0, AtMS: now.UnixMilli()}, 0},
		{"capped at a minute", rpm, rateBucket{Requests: 10, AtMS: now.Add(-time.Hour).UnixMilli()}, false, 0, rateBucket{Requests: 59, AtMS: now.UnixMilli()}, 0},
		{"tokens", tpm, rateBucket{Tokens: 1000, AtMS: now.UnixMilli()}, false, 400, rateBucket{Tokens: 600, AtMS: now.UnixMilli()}, 0},
		{"tokens wait", tpm, rateBucket{Tokens: 100, AtMS: now.UnixMilli()}, false, 200, rateBucket{Tokens: 100, AtMS: now.UnixMilli()}, time.Second},
		{"more than a minute's worth takes a full bucket", tpm, rateBucket{}, true, 1 << 40, rateBucket{Tokens: 0, AtMS: now.UnixMilli()}, 0},
	} {
		got, wait := take(c.r, c.b, c.fresh, now, c.need)
		require.Equal(t, c.want, got, c.name)
		require.InDelta(t, c.wait, wait, float64(time.Millisecond), c.name)
	}
}

// egress_rate is one bucket per key across workers: two runs on two
// workers injecting the same key share requests_per_minute = 3, so of
// five requests three reach the provider and two are answered with the
// provider's own 429 and how long to wait (retry-after), which the
// agent's client waits out itself. A request the bucket gives within the
// worker's bound waits for it instead, and goes.
func TestRateSharedByTwoWorkers(t *testing.T) {
	t.Parallel()
	srv, kv := budgetServer(t)
	prov := newProvider(t)
	extra := "egress_rate = { requests_per_minute = 3 }\n"
	noWait := func(c *Config) { c.RateWait = -1 }
	runs := []meteredRun{startMeteredWith(t, srv, prov, messages.DefaultPool, "r1", "", extra, noWait), startMeteredWith(t, srv, prov, messages.DefaultPool, "r2", "", extra, noWait)}
	var mu sync.Mutex
	codes := map[int]int{}
	var retry []string
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := runs[i%2].client.Post(runs[i%2].url, "application/json", strings.NewReader(`{"model":"claude-test","max_tokens":8}`))
			if !assertNoErr(t, err) {
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			codes[resp.StatusCode]++
			if resp.StatusCode == http.StatusTooManyRequests {
				retry = append(retry, resp.Header.Get("Retry-After"))
				if !strings.Contains(string(body), "rate_limit_error") || !strings.Contains(string(body), "egress_rate") {
					t.Errorf("not the provider's rate limit error naming egress_rate: %s", body)
				}
				if v := resp.Header.Get("X-Should-Retry"); v != "" {
					t.Errorf("x-should-retry %q: the client is meant to retry after the wait", v)
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, map[int]int{http.StatusOK: 3, http.StatusTooManyRequests: 2}, codes)
	require.EqualValues(t, 3, prov.served.Load())
	for _, r := range retry {
		require.Contains(t, []string{"20", "19", "21"}, r, "a request every 20s at 3 a minute")
	}

	// A bucket that gives within the bound: the request waits and goes.
	waits := startMeteredWith(t, srv, prov, messages.DefaultPool, "r3", "", "egress_rate = { requests_per_minute = 120 }\n", func(c *Config) { c.RateWait = 5 * time.Second })
	empty, err := json.Marshal(rateBucket{AtMS: time.Now().UnixMilli()})
	require.NoError(t, err)
	_, err = kv.Put(context.Background(), rateKey("sk"), empty)
	require.NoError(t, err)
	start := time.Now()
	require.Equal(t, http.StatusOK, waits.post(t))
	took := time.Since(start)
	require.GreaterOrEqual(t, took, 400*time.Millisecond, "a request every 500ms at 120 a minute")
	require.Less(t, took, 5*time.Second)
	t.Logf("waited %s for the key's rate", took.Round(time.Millisecond))
}

func assertNoErr(t *testing.T, err error) bool {
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}
