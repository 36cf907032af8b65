//go:build bench

package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/console"
	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// consoleRuns is how many run states the console benchmark stores.
const consoleRuns = 10000

// TestConsole measures the web console with consoleRuns runs in the
// jetcrew-runs bucket: the runs page's server time to first byte (first
// page, a filtered page, a deep page) against a static asset's, its size,
// and the delay from a state change to its server-sent event on an open
// runs page against a bare KV watch's delay in the same run.
func TestConsole(t *testing.T) {
	s := workertest.StartServer(t)
	nc := workertest.Connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = worker.Provision(t.Context(), js, worker.ProvisionConfig{})
	require.NoError(t, err)
	kv, err := js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	base := fillRuns(t, js)

	d, err := dispatcher.New(nc)
	require.NoError(t, err)
	c, err := console.New(console.Config{Dispatcher: d})
	require.NoError(t, err)
	start := time.Now()
	c.Start(t.Context())
	record(t, "console_load_10k_runs_ms", Figure{Value: round(ms(time.Since(start)), 1), Unit: "ms",
		What: "console start: load 10,000 run states from the KV bucket (one WatchAll)"})
	defer c.Stop()
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()

	static, _ := ttfb(t, srv.URL+"/static/app.css", 200)
	record(t, "console_static_ttfb_p50_ms", Figure{Value: round(median(static), 3), Unit: "ms", Samples: len(static),
		What: "time to first byte of /static/app.css (embedded asset), loopback HTTP"})
	for _, p := range []struct{ name, path, what string }{
		{"console_runs_ttfb", "/runs", "the runs page, newest 50 of 10,000 runs"},
		{"console_runs_filtered_ttfb", "/runs?state=failed&label=shard%3D3", "the runs page filtered by state and label (of 10,000 runs)"},
		{"console_runs_search_ttfb", "/runs?q=Shard%3D3", "the runs page searched (q: id, group, labels, reason; any case) of 10,000 runs"},
		{"console_runs_deep_ttfb", "/runs?before=" + deepCursor(base), "the runs page 5,000 runs deep (keyset cursor)"},
	} {
		xs, size := ttfb(t, srv.URL+p.path, 200)
		record(t, p.name+"_p50_ms", Figure{Value: round(median(xs), 3), Unit: "ms", Samples: len(xs), Baseline: "console_static_ttfb_p50_ms",
			What: "time to first byte of " + p.what + ", loopback HTTP"})
		record(t, p.name+"_p99_ms", Figure{Value: round(percentile(xs, 0.99), 3), Unit: "ms", Samples: len(xs), What: "as above, p99"})
		if p.name == "console_runs_ttfb" {
			record(t, "console_runs_page_bytes", Figure{Value: float64(size), Unit: "bytes", What: "size of that page (HTML, uncompressed)"})
		}
	}
	liveDelays(t, srv.URL, kv)
}

// fillRuns stores consoleRuns run states, one second apart in queue time,
// and returns the queue time of the first.
func fillRuns(t *testing.T, js jetstream.JetStream) time.Time {
	t.Helper()
	base := time.Now().Add(-consoleRuns * time.Second).UTC()
	states := []messages.State{messages.StateSucceeded, messages.StateSucceeded, messages.StateFailed, messages.StateCancelled}
	var futs []jetstream.PubAckFuture
	for i := range consoleRuns {
		st := messages.RunState{Version: messages.StateVersion, ID: fmt.Sprintf("bench-%05d", i), State: states[i%len(states)],
			Profile: "shell", Pool: "default", Group: fmt.Sprintf("g%d", i%100), Labels: map[string]string{"shard": fmt.Sprint(i % 10)},
			Reason: "exit code 1", QueuedAt: base.Add(time.Duration(i) * time.Second), UpdatedAt: base}
		data, err := json.Marshal(st)
		require.NoError(t, err)
		f, err := js.PublishAsync("$KV."+messages.BucketRuns+"."+st.ID, data)
		require.NoError(t, err)
		futs = append(futs, f)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("storing the run states took over 30s")
	}
	for _, f := range futs {
		select {
		case err := <-f.Err():
			require.NoError(t, err)
		default:
		}
	}
	return base
}

// deepCursor is the runs page cursor (console's "<queued unix ns>_<id>")
// after the 5,000 newest runs, fillRuns' runs having queue times base+i s.
func deepCursor(base time.Time) string {
	i := consoleRuns - 5000
	return fmt.Sprintf("%d_bench-%05d", base.Add(time.Duration(i)*time.Second).UnixNano(), i)
}

// ttfb GETs url n times and returns each server time to first byte, in
// milliseconds, and the body size of the last.
func ttfb(t *testing.T, url string, n int) ([]float64, int) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	var xs []float64
	size := 0
	for range n {
		var sent, first time.Time
		trace := &httptrace.ClientTrace{
			WroteRequest:         func(httptrace.WroteRequestInfo) { sent = time.Now() },
			GotFirstResponseByte: func() { first = time.Now() },
		}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodGet, url, nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		xs = append(xs, ms(first.Sub(sent)))
		size = len(body)
	}
	return xs, size
}

// liveDelays measures, for 200 state changes one after another, the delay
// from the KV put to its server-sent event on /live/runs, and to a bare KV
// watch's update.
func liveDelays(t *testing.T, base string, kv jetstream.KeyValue) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var mu sync.Mutex
	seenSSE, seenKV := map[string]time.Time{}, map[string]time.Time{}
	w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	require.NoError(t, err)
	defer w.Stop()
	go func() { // ends with ctx (the watcher's channel closes)
		for e := range w.Updates() {
			if e != nil {
				mu.Lock()
				seenKV[e.Key()] = time.Now()
				mu.Unlock()
			}
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/live/runs?q=live-", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	go func() { // ends when the response body is closed
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var row struct{ ID string }
			if json.Unmarshal([]byte(data), &row) == nil {
				mu.Lock()
				seenSSE[row.ID] = time.Now()
				mu.Unlock()
			}
		}
	}()
	var sse, bare []float64
	for i := range 200 {
		id := fmt.Sprintf("live-%03d", i)
		st, _ := json.Marshal(messages.RunState{Version: 1, ID: id, State: messages.StateQueued, Pool: "default", QueuedAt: time.Now()})
		put := time.Now()
		_, err := kv.Put(ctx, id, st)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return !seenSSE[id].IsZero() && !seenKV[id].IsZero()
		}, 5*time.Second, 100*time.Microsecond, "state change %s never reached the page", id)
		mu.Lock()
		sse, bare = append(sse, ms(seenSSE[id].Sub(put))), append(bare, ms(seenKV[id].Sub(put)))
		mu.Unlock()
	}
	record(t, "kv_watch_delay_p50_ms", Figure{Value: round(median(bare), 3), Unit: "ms", Samples: len(bare), What: "KV put to a bare KV watch's update, same process"})
	record(t, "kv_watch_delay_p99_ms", Figure{Value: round(percentile(bare, 0.99), 3), Unit: "ms", Samples: len(bare), What: "as above, p99"})
	record(t, "console_live_delay_p50_ms", Figure{Value: round(median(sse), 3), Unit: "ms", Samples: len(sse), Baseline: "kv_watch_delay_p50_ms",
		What: "KV put of a run state to its server-sent event on an open runs page (/live/runs)"})
	record(t, "console_live_delay_p99_ms", Figure{Value: round(percentile(sse, 0.99), 3), Unit: "ms", Samples: len(sse), Baseline: "kv_watch_delay_p99_ms", What: "as above, p99"})
}
