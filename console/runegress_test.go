package console

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// The run page's timeline says what an egress event was: a refusal, an
// upstream failure with its cause, or an allowed attempt; the run's choice
// of method, host and reason is made visible.
func TestToLiveEgress(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ev   messages.EgressEvent
		text string
	}{
		{messages.EgressEvent{Method: "CONNECT", Host: "evil.example", Port: 443, Reason: "not in the profile's egress allowlist"},
			"refused: CONNECT evil.example:443: not in the profile's egress allowlist"},
		{messages.EgressEvent{Method: "POST", Host: "api.anthropic.com", Port: 443, Allowed: true,
			Reason: "upstream certificate not trusted: x509: certificate signed by unknown authority"},
			"upstream failed: POST api.anthropic.com:443: upstream certificate not trusted: x509: certificate signed by unknown authority"},
		{messages.EgressEvent{Method: "POST", Host: "api.anthropic.com", Port: 443, Allowed: true, BytesUp: 10, BytesDown: 2048},
			"allowed: POST api.anthropic.com:443 (10 bytes up, 2,048 down)"},
		{messages.EgressEvent{Reason: "too many connections"}, "refused: too many connections"},
		{messages.EgressEvent{Method: "GET\x1b[2J", Host: "h", Port: 80, Reason: "x"}, "refused: GET\u241b[2J h:80: x"},
	} {
		data, err := json.Marshal(tc.ev)
		require.NoError(t, err)
		name, le := toLive(dispatcher.WatchEvent{Type: messages.EventEgress, Data: data}, nil)
		require.Equal(t, "event", name)
		require.Equal(t, tc.text, le.Text)
	}
}

// The run page shows the run's egress totals, its upstream failures among
// them, and its live stream carries them as they change.
func TestRunPageEgressTotals(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	now := time.Now().UTC()
	st := messages.RunState{ID: "eg-1", State: messages.StateRunning, Pool: "default", Profile: "p", Attempts: 1,
		QueuedAt: now, StartedAt: now, UpdatedAt: now,
		Egress: &messages.EgressTotals{Allowed: 4, Refused: 1, BytesUp: 100, BytesDown: 2000, UpstreamFailed: 2}}
	b.putStates(t, st)
	const want = "4 allowed · 1 refused · 2 upstream failures"
	code, body := b.get(t, "/runs/eg-1")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<dt id="egress-label" >Egress</dt><dd id="egress" >`+want+`</dd>`)
	require.Equal(t, want, newRunDetail(st).Egress)
	require.Equal(t, "-", newRunDetail(messages.RunState{ID: "x"}).Egress)
	b.putStates(t, messages.RunState{ID: "plain-1", State: messages.StateRunning, Pool: "default", Profile: "shell", UpdatedAt: now})
	code, body = b.get(t, "/runs/plain-1")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<dt id="egress-label" hidden>Egress</dt><dd id="egress" hidden>-</dd>`, "no egress proxy: nothing shown")
}
