package coordination_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/relay"
)

// The relay's endpoint table holds every endpoint of package relay, with
// its method, each added by the feature serving it; a session answers
// each as the protocol says (hello and steer/ack with a bare 204), and
// anything else as net/http does.
func TestRelayEndpointTable(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{
		"POST " + relay.PathHello,
		"GET " + relay.PathStatus, "POST " + relay.PathSend, "POST " + relay.PathInbox,
		"POST " + relay.PathClaim, "POST " + relay.PathRelease, "GET " + relay.PathClaims,
		"POST " + relay.PathAsk, "POST " + relay.PathReply,
		"POST " + relay.PathSteerNext, "POST " + relay.PathSteerAck, "POST " + relay.PathNotice,
	}, coordination.RelayEndpoints())

	b := setup(t)
	h := b.host(t, coordination.Config{})
	s, _ := b.serve(t, h, "r1", "g")
	hc := socketHTTP(s.SocketPath())
	for _, tc := range []struct {
		method, path, body string
		status             int
		json               bool
	}{
		{http.MethodPost, relay.PathHello, "", http.StatusNoContent, false},
		{http.MethodPost, relay.PathSteerAck, `{"id":"s1","delivered":true}`, http.StatusNoContent, false},
		{http.MethodPost, relay.PathSteerAck, `{"delivered":true}`, http.StatusBadRequest, true},
		{http.MethodGet, relay.PathClaims, "", http.StatusOK, true},
		{http.MethodPost, relay.PathNotice, `{}`, http.StatusOK, true},
		{http.MethodGet, relay.PathSend, "", http.StatusMethodNotAllowed, false},
		{http.MethodPost, "/v1/nothing", "{}", http.StatusNotFound, false},
	} {
		req, err := http.NewRequest(tc.method, "http://run"+tc.path, strings.NewReader(tc.body))
		require.NoError(t, err)
		resp, err := hc.Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, tc.status, resp.StatusCode, "%s %s: %s", tc.method, tc.path, body)
		if tc.status == http.StatusNoContent {
			require.Empty(t, body)
		}
		require.Equal(t, tc.json, resp.Header.Get("Content-Type") == "application/json", "%s %s", tc.method, tc.path)
	}
}
