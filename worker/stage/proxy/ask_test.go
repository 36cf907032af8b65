package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// askBed is a Proxies on an embedded server with the egress_ask buckets,
// a run of a profile asking about api.example.com:443, and an operator's
// dispatcher.
type askBed struct {
	a  *asker
	d  *dispatcher.Dispatcher
	js jetstream.JetStream
}

func newAskBed(t *testing.T, runID, timeout string) askBed {
	t.Helper()
	s := coordtest.StartServer(t)
	nc := coordtest.Connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	for _, b := range []string{messages.BucketEgressAsks, messages.BucketEgressApprovals} {
		_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b})
		require.NoError(t, err)
	}
	ps, err := profile.ParseProfiles("t", []byte(`[profiles.asking]
image = "x"
command = ["/bin/sh", "-c", "{prompt}"]
coordination = false
egress_ask = ["api.example.com:443"]
egress_ask_timeout = "`+timeout+`"
`))
	require.NoError(t, err)
	prof := ps["asking"]
	p := New(Config{WorkerID: "w1", Pool: "default", NC: nc, Registry: prometheus.NewRegistry(), Log: zerolog.Nop()})
	asks, approvals, err := p.askBuckets(ctx)
	require.NoError(t, err)
	run := &stage.Run{Request: messages.RunRequest{ID: runID, Profile: "asking"}, Profile: &prof}
	d, err := dispatcher.New(coordtest.Connect(t, s))
	require.NoError(t, err)
	return askBed{a: &asker{p: p, run: run, asks: asks, approvals: approvals}, d: d, js: js}
}

// pending waits for one question to be listed and returns it.
func (b askBed) pending(t *testing.T) messages.EgressAsk {
	t.Helper()
	var qs []messages.EgressAsk
	require.Eventually(t, func() bool {
		var err error
		qs, err = b.d.EgressPending(context.Background())
		return err == nil && len(qs) == 1
	}, 5*time.Second, 10*time.Millisecond)
	return qs[0]
}

// A connection to an egress_ask host waits for an operator: the question
// is listed (jetcrew egress pending) with the run, profile and host; an
// answer for the run lets it go with who answered; a second answer is
// refused; the question is gone once answered. An answer for the profile
// answers the next run's question at once, without asking.
func TestAskWaitsForOperator(t *testing.T) {
	t.Parallel()
	b := newAskBed(t, "r1", "30s")
	got := make(chan egress.Decision, 1)
	go func() { got <- b.a.ask(context.Background(), "api.example.com", 443) }()
	q := b.pending(t)
	require.Equal(t, "r1.1", q.ID)
	require.Equal(t, "r1", q.RunID)
	require.Equal(t, "asking", q.Profile)
	require.Equal(t, "api.example.com", q.Host)
	require.Equal(t, 443, q.Port)
	require.WithinDuration(t, q.Time.Add(30*time.Second), q.Until, time.Second)
	select {
	case d := <-got:
		t.Fatalf("answered before the operator: %+v", d)
	case <-time.After(300 * time.Millisecond):
	}

	_, err := b.d.AnswerEgress(context.Background(), q.ID, true, false, "alice")
	require.NoError(t, err)
	d := <-got
	require.Equal(t, "allowed by alice for the run", d.String())
	_, err = b.d.AnswerEgress(context.Background(), q.ID, false, false, "bob")
	require.ErrorIs(t, err, dispatcher.ErrNoQuestion, "answered: no longer waiting")
	qs, err := b.d.EgressPending(context.Background())
	require.NoError(t, err)
	require.Empty(t, qs)

	// Deny for the profile: this run's question, then any later one at once.
	go func() { got <- b.a.ask(context.Background(), "api.example.com", 443) }()
	q = b.pending(t)
	_, err = b.d.AnswerEgress(context.Background(), q.ID, false, true, "bob")
	require.NoError(t, err)
	require.Equal(t, "denied by bob for profile asking", (<-got).String())
	start := time.Now()
	require.Equal(t, "denied by bob for profile asking", b.a.ask(context.Background(), "api.example.com", 443).String())
	require.Less(t, time.Since(start), askPoll, "a profile's answer needs no question")
}

// No answer within egress_ask_timeout refuses the connection, and the
// question is withdrawn.
func TestAskTimesOut(t *testing.T) {
	t.Parallel()
	b := newAskBed(t, "r2", "1s")
	d := b.a.ask(context.Background(), "api.example.com", 443)
	require.True(t, d.TimedOut)
	require.Equal(t, "no answer within 1s", d.String())
	qs, err := b.d.EgressPending(context.Background())
	require.NoError(t, err)
	require.Empty(t, qs)
	_, err = b.d.AnswerEgress(context.Background(), "r2.1", true, false, "late")
	require.ErrorIs(t, err, dispatcher.ErrNoQuestion)
}
