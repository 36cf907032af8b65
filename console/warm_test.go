package console

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// The overview's workers table shows each worker's pool and concurrency
// from its presence value, a heartbeat age (not "- ago"), and its warm
// pools as ready/target; a pool that backs off shows the engine's refusal,
// escaped and with its control characters made visible.
func TestOverviewShowsWarmPools(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	kv, err := b.js.KeyValue(t.Context(), messages.BucketWorkers)
	require.NoError(t, err)
	p, err := json.Marshal(messages.WorkerPresence{Worker: "w-warm", Pool: "gpu", Concurrency: 3, Time: time.Now().UTC(),
		Warm: []messages.WarmPool{
			{Profile: "hot", Target: 2, Ready: 1},
			{Profile: "claude", Target: 1, Error: `create: No such image: <script>alert(1)</script>` + "\x1b[2J"},
		}})
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), "w-warm", p)
	require.NoError(t, err)

	var body string
	require.Eventually(t, func() bool {
		_, body = b.get(t, "/overview/fragment")
		return strings.Contains(body, "w-warm") && strings.Contains(body, `<td class="num">4</td>`)
	}, 10*time.Second, 20*time.Millisecond, "the overview never listed both workers: %s", body)
	row := between(body, `<td class="mono">w-warm</td>`, "</tr>")
	require.Contains(t, row, `<a href="/runs?pool=gpu">gpu</a></td><td class="num">3</td>`)
	require.Contains(t, row, `<span class="mono">hot</span> 1/2</div>`)
	require.Contains(t, row, `<span class="mono">claude</span> 0/1 <span class="backoff">backing off: create: No such image: &lt;script&gt;alert(1)&lt;/script&gt;␛[2J</span>`)
	require.NotContains(t, body, "<script>")
	require.NotContains(t, body, "- ago", "every worker's heartbeat is read from its presence value")

	// The setup's worker (pool default, concurrency 4) keeps no warm
	// container.
	require.Regexp(t, `<a href="/runs\?pool=default">default</a></td><td class="num">4</td><td class="num">0</td><td>[0-9.]+m?s ago</td>\s*<td class="wrap"><span class="muted">-</span></td>`, body)
}

// A run that started in a warm container says so on its page (beside its
// container, and in its receipt); a cold one does not.
func TestRunPageSaysWarm(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	kv, err := b.js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	now := time.Now().UTC()
	for _, st := range []messages.RunState{
		{Version: 1, ID: "warm-1", State: messages.StateSucceeded, Profile: "hot", Pool: "default", ContainerID: "0123456789abcdef0123",
			Warm: true, Receipt: &messages.Receipt{Profile: "hot", Warm: true}, QueuedAt: now, StartedAt: now, FinishedAt: now, UpdatedAt: now},
		{Version: 1, ID: "cold-1", State: messages.StateSucceeded, Profile: "hot", Pool: "default", ContainerID: "fedcba9876543210fedc",
			Receipt: &messages.Receipt{Profile: "hot"}, QueuedAt: now, StartedAt: now, FinishedAt: now, UpdatedAt: now},
	} {
		data, err := json.Marshal(st)
		require.NoError(t, err)
		_, err = kv.Put(t.Context(), st.ID, data)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { _, ok := b.c.cache.get("cold-1"); return ok }, 10*time.Second, 10*time.Millisecond)

	code, body := b.get(t, "/runs/warm-1")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<dt>Container</dt><dd><span class="mono" id="container">0123456789ab…</span> <span class="badge" id="warm" title="started in a warm container, kept ready by its worker before the run came" >warm`)
	require.Contains(t, between(body, `<pre class="receipt" id="receipt">`, "</pre>"), `&#34;warm&#34;: true`)

	code, body = b.get(t, "/runs/cold-1")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<dt>Container</dt><dd><span class="mono" id="container">fedcba987654…</span> <span class="badge" id="warm" title="started in a warm container, kept ready by its worker before the run came" hidden>warm`)
}

// The run page's timeline says a start was warm.
func TestToLiveWarmStart(t *testing.T) {
	t.Parallel()
	_, le := toLive(dispatcher.WatchEvent{Type: messages.EventStarted, Attempt: 1,
		Event: messages.Event{Worker: "w1", ContainerID: "c1", Warm: true}}, nil)
	require.Equal(t, "in a warm container", le.Text)
	require.Equal(t, "w1", le.Kind)
	_, le = toLive(dispatcher.WatchEvent{Type: messages.EventStarted, Attempt: 1,
		Event: messages.Event{Worker: "w1", ContainerID: "c1"}}, nil)
	require.Empty(t, le.Text)
	_, le = toLive(dispatcher.WatchEvent{Type: messages.EventFinished,
		Event: messages.Event{State: messages.StateSucceeded, Warm: true}}, nil)
	require.Equal(t, "succeeded", le.Text, "the finished event says its outcome alone")
}
