package origin_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/internal/origin"
)

func setup(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return nc, js
}

// What a stream's RePublish or a source put on a subject carries the
// server's stamp; what a client published does not, whatever headers it
// set (but the source stamp, which the server refuses from a client).
func TestRelayed(t *testing.T) {
	t.Parallel()
	nc, js := setup(t)
	ctx := context.Background()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}})
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "RELAY", Subjects: []string{"relay.in"},
		RePublish: &jetstream.RePublish{Source: "relay.in", Destination: "t.republished"}})
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORIGIN", Subjects: []string{"origin.in"}})
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "SOURCED", Sources: []*jetstream.StreamSource{{Name: "ORIGIN"}}})
	require.NoError(t, err)

	m := nats.NewMsg("t.published")
	m.Header.Set("Nats-Stream", "RELAY") // a header a publisher chose
	_, err = js.PublishMsg(ctx, m)
	require.NoError(t, err)
	_, err = js.Publish(ctx, "relay.in", []byte("r"))
	require.NoError(t, err)
	_, err = js.Publish(ctx, "origin.in", []byte("s"))
	require.NoError(t, err)
	forged := nats.NewMsg("t.forged")
	forged.Header.Set(origin.HeaderSource, "ORIGIN 1")
	_, err = js.PublishMsg(ctx, forged)
	require.Error(t, err, "the server refuses a client's source stamp")

	get := func(stream, subject string) *jetstream.RawStreamMsg {
		t.Helper()
		var got *jetstream.RawStreamMsg
		require.Eventually(t, func() bool {
			got, err = origin.Get(ctx, nc, stream, 0, "", subject)
			return err == nil
		}, 5*time.Second, 10*time.Millisecond)
		return got
	}
	require.False(t, origin.Relayed(get("T", "t.published").Header))
	require.True(t, origin.Relayed(get("T", "t.republished").Header))
	require.True(t, origin.Relayed(get("SOURCED", "origin.in").Header))

	_, err = origin.Get(ctx, nc, "T", 0, "", "t.none")
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound)
	_, err = origin.Get(ctx, nc, "NONE", 1, "", "")
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
}

// Newest reads past relayed messages to the newest a client published, and
// names the newest message whatever wrote it.
func TestNewest(t *testing.T) {
	t.Parallel()
	nc, js := setup(t)
	ctx := context.Background()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}})
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "RELAY", Subjects: []string{"relay.>"},
		RePublish: &jetstream.RePublish{Source: "relay.*", Destination: "t.{{wildcard(1)}}"}})
	require.NoError(t, err)
	relay := func(key, body string) {
		t.Helper()
		_, err := js.Publish(ctx, "relay."+key, []byte(body))
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			m, err := origin.Get(ctx, nc, "T", 0, "", "t."+key)
			return err == nil && string(m.Data) == body
		}, 5*time.Second, 10*time.Millisecond)
	}

	_, err = js.Publish(ctx, "t.k", []byte("one"))
	require.NoError(t, err)
	two, err := js.Publish(ctx, "t.k", []byte("two"))
	require.NoError(t, err)
	_, err = js.Publish(ctx, "t.other", []byte("other"))
	require.NoError(t, err)
	m, newest, err := origin.Newest(ctx, nc, "T", "t.k")
	require.NoError(t, err)
	require.Equal(t, "two", string(m.Data))
	require.Equal(t, two.Sequence, newest)

	relay("k", "relayed")
	relay("k", "relayed again")
	m, newest, err = origin.Newest(ctx, nc, "T", "t.k")
	require.NoError(t, err)
	require.Equal(t, "two", string(m.Data))
	require.Equal(t, two.Sequence, m.Sequence)
	require.Greater(t, newest, two.Sequence)

	relay("only", "relayed")
	_, newest, err = origin.Newest(ctx, nc, "T", "t.only")
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound)
	require.NotZero(t, newest)
	_, newest, err = origin.Newest(ctx, nc, "T", "t.none")
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound)
	require.Zero(t, newest)
}
