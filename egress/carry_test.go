package egress

import (
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/policy"
	"github.com/jetcrew/jetcrew/messages"
)

// postAll sends n model requests and returns their statuses.
func (mb *meterBundle) postAll(t *testing.T, n int) []int {
	t.Helper()
	var codes []int
	for range n {
		resp := mb.post(t, "claude-test", false)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	return codes
}

// A session that goes on from an earlier one's totals (an adopted run,
// Carry) ends with the totals of both, counts the earlier usage against
// the run's own budgets (max_model_requests 5: 3 requests before, 2
// after, the third after refused as past the budget) and against the
// cap on published events (MaxEvents 4: 3 published before, 1 after).
// Without Carry the second session would send 3 and publish 3.
func TestCarryGoesOnFromEarlierTotals(t *testing.T) {
	t.Parallel()
	h := &anthropicStandIn{}
	lim := Limits{MaxRequests: 5}
	capEvents := func(c *Config) { c.MaxEvents = 4 }
	first := meterSetup(t, h, Metering{Limits: lim}, capEvents)
	require.Equal(t, []int{200, 200, 200}, first.postAll(t, 3))
	first.waitEvents(t, 3)
	carried := Carried{Egress: first.sess.Close(), Usage: first.sess.Usage()}
	require.EqualValues(t, 3, carried.Usage.Requests)
	require.EqualValues(t, 21, carried.Usage.Tokens.Output)

	second := meterSetupCarried(t, h, Metering{Limits: lim}, &carried, capEvents)
	require.Equal(t, []int{200, 200, http.StatusTooManyRequests}, second.postAll(t, 3), "the budget counts the earlier requests")
	egress := second.sess.Close()
	u := second.sess.Usage()
	require.EqualValues(t, 5, u.Requests, "both sessions' requests")
	require.EqualValues(t, 35, u.Tokens.Output)
	require.EqualValues(t, 50, u.Tokens.Input)
	require.EqualValues(t, 1, u.Refused)
	b, ok := second.sess.Reached()
	require.True(t, ok)
	require.Equal(t, "max_model_requests", b.Key)
	require.Len(t, second.events(), 1, "the cap on events counts the earlier session's")
	require.Greater(t, egress.Allowed, carried.Egress.Allowed, "egress totals go on")
	require.Greater(t, egress.BytesDown, carried.Egress.BytesDown)
}

// A session made but never served closes at once, and Serve after Close
// fails.
func TestNewNeverServedCloses(t *testing.T) {
	t.Parallel()
	s, err := New(Config{}, "run1", policy.Policy{}, t.TempDir()+"/egress.sock")
	require.NoError(t, err)
	require.Equal(t, messages.EgressTotals{}, s.Close())
	require.Error(t, s.Serve())
}
