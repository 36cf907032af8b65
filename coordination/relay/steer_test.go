package relay_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination/relay"
)

func TestDecodeSteerRequests(t *testing.T) {
	t.Parallel()
	r, err := relay.DecodeSteerNextRequest(nil)
	require.NoError(t, err)
	require.Equal(t, relay.SteerNextRequest{}, r)
	r, err = relay.DecodeSteerNextRequest([]byte(`{"wait_seconds":25,"closed":true}`))
	require.NoError(t, err)
	require.Equal(t, relay.SteerNextRequest{WaitSeconds: 25, Closed: true}, r)
	for _, bad := range []string{`{"wait_seconds":31}`, `{"wait_seconds":-1}`, `{"id":"x"}`, `[`} {
		_, err := relay.DecodeSteerNextRequest([]byte(bad))
		var ie *relay.InvalidError
		require.ErrorAs(t, err, &ie, bad)
	}
	_, err = relay.DecodeSteerAck([]byte(`{"delivered":true}`))
	require.ErrorContains(t, err, "id is empty")
	a, err := relay.DecodeSteerAck([]byte(`{"id":"s1","delivered":true}`))
	require.NoError(t, err)
	require.Equal(t, relay.SteerAck{ID: "s1", Delivered: true}, a)
	_, err = relay.DecodeNoticeRequest([]byte(`{"after":3,"wait_seconds":40}`))
	require.Error(t, err)
}

// FuzzDecodeSteerRequests: the launcher's and the bridge's steering calls
// come from inside the jail; whatever they hold is refused with an
// *InvalidError or accepted within range.
func FuzzDecodeSteerRequests(f *testing.F) {
	for _, s := range []string{`{"wait_seconds":1}`, `{"closed":true}`, `{"id":"a","delivered":false,"reason":"x"}`, `{"after":1}`, `{`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		check := func(err error) {
			var ie *relay.InvalidError
			if err != nil && !errors.As(err, &ie) {
				t.Fatalf("error is not an InvalidError: %v", err)
			}
		}
		n, err := relay.DecodeSteerNextRequest(data)
		check(err)
		if err == nil && (n.WaitSeconds < 0 || n.WaitSeconds > relay.MaxWaitSeconds) {
			t.Fatalf("accepted wait %d", n.WaitSeconds)
		}
		a, err := relay.DecodeSteerAck(data)
		check(err)
		if err == nil && a.ID == "" {
			t.Fatal("accepted an ack without id")
		}
		no, err := relay.DecodeNoticeRequest(data)
		check(err)
		if err == nil && (no.WaitSeconds < 0 || no.WaitSeconds > relay.MaxWaitSeconds) {
			t.Fatalf("accepted wait %d", no.WaitSeconds)
		}
	})
}
