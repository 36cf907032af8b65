package proxy

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// A model request whose host cannot be reached is counted in the run's
// record while it runs: Check asks for the record to be written, and Note
// writes the egress totals with the upstream failure.
func TestUpstreamFailureInRecord(t *testing.T) {
	t.Parallel()
	srv, _ := budgetServer(t)
	prov := newProvider(t)
	r := startMetered(t, srv, prov, "u1", "", "")
	_, _ = r.s.Check(time.Now())
	prov.srv.Close() // the host now refuses the connection
	require.Equal(t, http.StatusBadGateway, r.post(t))
	require.Eventually(t, func() bool {
		_, changed := r.s.Check(time.Now())
		return changed
	}, 5*time.Second, 10*time.Millisecond, "the failure never asked for the record to be written")
	st := messages.RunState{State: messages.StateRunning}
	r.s.Note(&st)
	require.NotNil(t, st.Egress)
	require.EqualValues(t, 1, st.Egress.UpstreamFailed)
	require.EqualValues(t, 1, st.Egress.Allowed)
}
