package dispatcher

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// EgressWaiting counts every waiting question, reads only the oldest
// limit, leaves out those answered, and keeps to one run when asked.
func TestEgressWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noProvision: true})
	ctx := t.Context()

	w, err := b.d.EgressWaiting(ctx, "", 10)
	require.NoError(t, err, "no bucket yet: none waits")
	require.Equal(t, EgressWaiting{}, w)

	kv, err := b.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: messages.BucketEgressAsks, History: 1, TTL: messages.EgressAskMaxAge})
	require.NoError(t, err)
	put := func(run string, n int) {
		now := time.Now().UTC()
		q := messages.EgressAsk{ID: messages.EgressAskID(run, n), RunID: run, Profile: "p", Host: "example.com", Port: 443,
			Time: now, Until: now.Add(time.Minute)}
		data, err := json.Marshal(q)
		require.NoError(t, err)
		_, err = kv.Put(ctx, messages.EgressAskKey(q.ID), data)
		require.NoError(t, err)
	}
	put("run-a", 1)
	put("run-b", 1)
	put("run-a", 2)
	put("run-c", 1)
	_, err = kv.Put(ctx, messages.EgressAnswerKey("run-c.1"), []byte(`{"allow":true,"scope":"run","by":"x"}`))
	require.NoError(t, err)

	w, err = b.d.EgressWaiting(ctx, "", 2)
	require.NoError(t, err)
	require.Equal(t, 3, w.Total, "run-c.1 is answered")
	require.Len(t, w.Asks, 2)
	require.Equal(t, "run-a.1", w.Asks[0].ID, "oldest first")
	require.Equal(t, "run-b.1", w.Asks[1].ID)

	w, err = b.d.EgressWaiting(ctx, "", 0)
	require.NoError(t, err)
	require.Equal(t, 3, w.Total)
	require.Empty(t, w.Asks, "limit 0 only counts")

	w, err = b.d.EgressWaiting(ctx, "run-a", 10)
	require.NoError(t, err)
	require.Equal(t, 2, w.Total)
	require.Equal(t, []string{"run-a.1", "run-a.2"}, []string{w.Asks[0].ID, w.Asks[1].ID})

	w, err = b.d.EgressWaiting(ctx, "run-c", 10)
	require.NoError(t, err)
	require.Equal(t, EgressWaiting{}, w)

	_, err = b.d.EgressWaiting(ctx, "run.a", 10)
	require.Error(t, err, "a run id that is not a token")
}
