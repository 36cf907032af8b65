package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// errStoreFailed is the JetStream error a publish gets when the stream
// will not store the message for one of its limits (here, per subject).
const errStoreFailed jetstream.ErrorCode = 10077

// runsStreamConfig returns JETCREW_RUNS's configuration as the server
// holds it.
func runsStreamConfig(t *testing.T, js jetstream.JetStream) jetstream.StreamConfig {
	t.Helper()
	s, err := js.Stream(t.Context(), messages.StreamRuns)
	require.NoError(t, err)
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	return info.Config
}

// publishErrCode publishes body with headers h to subject and returns the
// JetStream error code the stream answered with (0 when it stored it).
func publishErrCode(t *testing.T, js jetstream.JetStream, subject string, body []byte, h nats.Header) jetstream.ErrorCode {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data, m.Header = body, h
	_, err := js.PublishMsg(t.Context(), m)
	if err == nil {
		return 0
	}
	var apiErr *jetstream.APIError
	require.True(t, errors.As(err, &apiErr), "publish to %s: %v", subject, err)
	return apiErr.ErrorCode
}

// A request far larger than any valid one, to a pool nobody serves, is
// refused by the stream instead of being stored for good; the largest valid
// request, signed, is still stored.
func TestRunsStreamRefusesOversizedRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	huge := []byte(`{"profile":"shell","prompt":"` + strings.Repeat("x", 900<<10) + `"}`)
	require.Equal(t, jetstream.JSErrCodeStreamMessageExceedsMaximum, publishErrCode(t, b.js, messages.SubjectRuns("nopool"), huge, nil))
	require.EqualValues(t, messages.MaxRequestMsgBytes, runsStreamConfig(t, b.js).MaxMsgSize)
	// Just past the limit, headers included.
	over := make([]byte, messages.MaxRequestMsgBytes-len("NATS/1.0\r\nA: b\r\n\r\n")+1)
	require.Equal(t, jetstream.JSErrCodeStreamMessageExceedsMaximum, publishErrCode(t, b.js, messages.SubjectRuns("nopool"), over, nats.Header{"A": {"b"}}))

	// The largest valid body with the headers jetcrew's own clients set.
	largest := []byte(`{"id":"r1","profile":"shell","prompt":"` + strings.Repeat("x", messages.MaxRequestBytes-len(`{"id":"r1","profile":"shell","prompt":""}`)) + `"}`)
	require.Len(t, largest, messages.MaxRequestBytes)
	h := nats.Header{}
	h.Set(jetstream.MsgIDHeader, "replay-"+strings.Repeat("r", messages.MaxTokenLen)+"-18446744073709551615")
	h.Set("Nats-Expected-Stream", messages.StreamRuns)
	h.Set(messages.HeaderSigner, "U"+strings.Repeat("A", 55))
	h.Set(messages.HeaderSignature, strings.Repeat("A", 88))
	h.Set("Traceparent", "00-"+strings.Repeat("0", 32)+"-"+strings.Repeat("0", 16)+"-01")
	require.Zero(t, publishErrCode(t, b.js, messages.SubjectRuns("nopool"), largest, h))
	require.Equal(t, uint64(1), b.streamMsgs(t, messages.StreamRuns))
}

// One pool holds at most the per-pool limit of requests: past it, a
// submit to that pool is refused (nothing queued is dropped) while other
// pools still take requests.
func TestRunsStreamPerPoolLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for i := range worker.DefaultRunsMaxPerPool {
		require.Zero(t, publishErrCode(t, b.js, messages.SubjectRuns("nopool"), fmt.Appendf(nil, `{"id":"n%d","profile":"shell"}`, i), nil), "request %d", i)
	}
	require.Equal(t, errStoreFailed, publishErrCode(t, b.js, messages.SubjectRuns("nopool"), []byte(`{"id":"over","profile":"shell"}`), nil))
	cfg := runsStreamConfig(t, b.js)
	require.EqualValues(t, worker.DefaultRunsMaxPerPool, cfg.MaxMsgsPerSubject)
	require.True(t, cfg.DiscardNewPerSubject)
	require.Equal(t, jetstream.DiscardNew, cfg.Discard)
	require.Equal(t, uint64(worker.DefaultRunsMaxPerPool), b.streamMsgs(t, messages.StreamRuns), "the first requests are kept")
	// Another pool is not affected.
	require.Zero(t, publishErrCode(t, b.js, messages.SubjectRuns("other"), []byte(`{"id":"o1","profile":"shell","pool":"other"}`), nil))

	// The limit is a provisioning setting.
	small := setup(t, func(c *worker.Config) { c.Provision.RunsMaxPerPool = 2 })
	for i := range 2 {
		require.Zero(t, publishErrCode(t, small.js, messages.SubjectRuns("nopool"), fmt.Appendf(nil, `{"id":"s%d","profile":"shell"}`, i), nil))
	}
	require.Equal(t, errStoreFailed, publishErrCode(t, small.js, messages.SubjectRuns("nopool"), []byte(`{"id":"s3","profile":"shell"}`), nil))
	none := setup(t, func(c *worker.Config) { c.Provision.RunsMaxPerPool = -1 })
	require.EqualValues(t, -1, runsStreamConfig(t, none.js).MaxMsgsPerSubject)
	require.False(t, runsStreamConfig(t, none.js).DiscardNewPerSubject)
}

// Requests are removed once they are older than the runs max age
// (default 7 days), so requests for a pool no worker serves do not stay
// for good; a max age shorter than the longest run a request may ask for
// is refused.
func TestRunsStreamMaxAge(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	require.Equal(t, worker.DefaultRunsMaxAge, runsStreamConfig(t, b.js).MaxAge)
	require.Equal(t, 7*24*time.Hour, worker.DefaultRunsMaxAge)

	b2 := setup(t, func(c *worker.Config) { c.Provision.RunsMaxAge = 36 * time.Hour })
	require.Equal(t, 36*time.Hour, runsStreamConfig(t, b2.js).MaxAge)

	s := workertest.StartServer(t)
	js, err := jetstream.New(workertest.Connect(t, s))
	require.NoError(t, err)
	_, err = worker.Provision(t.Context(), js, worker.ProvisionConfig{RunsMaxAge: time.Hour})
	require.ErrorContains(t, err, "runs max age 1h0m0s is shorter than the longest run timeout a request may ask for (24h0m0s)")
	_, err = js.Stream(t.Context(), messages.StreamRuns)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound, "nothing provisioned")
}

// oldRunsStream is JETCREW_RUNS as workers before the limits created it:
// no message size limit, no max age, no per-pool limit.
func oldRunsStream() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        messages.StreamRuns,
		Description: "jetcrew run requests, one subject per pool",
		Subjects:    []string{messages.SubjectRunsPrefix + ".>"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    1,
		Duplicates:  2 * time.Minute,
		AllowDirect: true,
		MaxBytes:    worker.DefaultRunsMaxBytes,
		Discard:     jetstream.DiscardNew,
	}
}

// An installation made by an older worker is updated in place: the limits
// apply to it, and what it holds stays queued (JetStream takes these
// changes on an existing stream).
func TestProvisionUpdatesExistingRunsStream(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	js, err := jetstream.New(workertest.Connect(t, s))
	require.NoError(t, err)
	ctx := t.Context()
	_, err = js.CreateStream(ctx, oldRunsStream())
	require.NoError(t, err)
	_, err = js.CreateOrUpdateConsumer(ctx, messages.StreamRuns, jetstream.ConsumerConfig{
		Durable: messages.ConsumerName("default"), FilterSubject: messages.SubjectRuns("default"),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: 5, MaxAckPending: 1024,
	})
	require.NoError(t, err)
	huge := []byte(`{"profile":"shell","prompt":"` + strings.Repeat("x", 900<<10) + `"}`)
	require.Zero(t, publishErrCode(t, js, messages.SubjectRuns("nopool"), huge, nil), "the old stream takes anything")
	require.Zero(t, publishErrCode(t, js, messages.SubjectRuns("default"), []byte(`{"id":"q1","profile":"shell"}`), nil))

	_, err = worker.Provision(ctx, js, worker.ProvisionConfig{})
	require.NoError(t, err)
	cfg := runsStreamConfig(t, js)
	require.EqualValues(t, messages.MaxRequestMsgBytes, cfg.MaxMsgSize)
	require.Equal(t, worker.DefaultRunsMaxAge, cfg.MaxAge)
	require.EqualValues(t, worker.DefaultRunsMaxPerPool, cfg.MaxMsgsPerSubject)
	require.True(t, cfg.DiscardNewPerSubject)

	st, err := js.Stream(ctx, messages.StreamRuns)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(2), info.State.Msgs, "queued requests are kept (the oversized one until its max age)")
	require.Equal(t, jetstream.JSErrCodeStreamMessageExceedsMaximum, publishErrCode(t, js, messages.SubjectRuns("nopool"), huge, nil))

	// The pool's consumer, made with one filter subject, now takes the
	// pool's replay subject too.
	cons, err := js.Consumer(ctx, messages.StreamRuns, messages.ConsumerName("default"))
	require.NoError(t, err)
	require.Empty(t, cons.CachedInfo().Config.FilterSubject)
	require.Equal(t, []string{messages.SubjectRuns("default"), messages.SubjectReplay("default")}, cons.CachedInfo().Config.FilterSubjects)
	require.Equal(t, uint64(1), cons.CachedInfo().NumPending, "its queued request is still pending")

	// Provisioning again with the same configuration changes nothing.
	_, err = worker.Provision(ctx, js, worker.ProvisionConfig{})
	require.NoError(t, err)
}

// Lowering the per-pool limit below what a pool holds would make
// JetStream drop that pool's oldest requests: Provision refuses instead,
// naming the pool, and drops nothing.
func TestProvisionRefusesToTrimAPool(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	js, err := jetstream.New(workertest.Connect(t, s))
	require.NoError(t, err)
	ctx := t.Context()
	_, err = js.CreateStream(ctx, oldRunsStream())
	require.NoError(t, err)
	for i := range 5 {
		require.Zero(t, publishErrCode(t, js, messages.SubjectRuns("busy"), fmt.Appendf(nil, `{"id":"b%d","profile":"shell","pool":"busy"}`, i), nil))
	}
	_, err = worker.Provision(ctx, js, worker.ProvisionConfig{RunsMaxPerPool: 3})
	require.ErrorContains(t, err, "jetcrew.runs.busy holds 5 requests")
	require.ErrorIs(t, err, worker.ErrPoolOverLimit)
	info, err := func() (*jetstream.StreamInfo, error) {
		st, err := js.Stream(ctx, messages.StreamRuns)
		if err != nil {
			return nil, err
		}
		return st.Info(context.Background())
	}()
	require.NoError(t, err)
	require.Equal(t, uint64(5), info.State.Msgs)
	require.EqualValues(t, -1, info.Config.MaxMsgsPerSubject, "the stream is left as it was")

	// A limit the pool fits is applied.
	_, err = worker.Provision(ctx, js, worker.ProvisionConfig{RunsMaxPerPool: 5})
	require.NoError(t, err)
	require.EqualValues(t, 5, runsStreamConfig(t, js).MaxMsgsPerSubject)
}
