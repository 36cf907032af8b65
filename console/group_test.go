package console

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/dispatcher"
)

// The conversation shows each message's sender as the runs
// read it (coordination.Sender), never a Jetcrew-From a publisher chose: a
// message on an operator subject is from "operator" whatever its header
// says, and its recipient is the run it names, not the "operator" suffix.
func TestGroupMessageSender(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, subject, from string
		wantFrom, wantTo    string
	}{
		{"operator subject claiming a run", "jetcrew.coord.default.team.bob.operator", "alice", "operator", "bob"},
		{"operator subject to all claiming a run", "jetcrew.coord.default.team.all.operator", "bob", "operator", "all"},
		{"operator subject without header", "jetcrew.coord.default.team.bob.operator", "", "operator", "bob"},
		{"worker-stamped run message", "jetcrew.coord.default.team.bob", "alice", "alice", "bob"},
		{"run message to the operator", "jetcrew.coord.default.team.operator", "alice", "alice", "operator"},
		{"five tokens without header", "jetcrew.coord.default.team.bob", "", "operator", "bob"},
		{"header that is no run id", "jetcrew.coord.default.team.bob", "al ice\u202e", "operator", "bob"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := nats.Header{}
			if tc.from != "" {
				h.Set(coordination.HeaderFrom, tc.from)
			}
			m := groupMessage(dispatcher.StreamMsg{Subject: tc.subject, Header: h, Data: []byte("hi")})
			require.Equal(t, tc.wantFrom, m.From)
			require.Equal(t, tc.wantTo, m.To)
			from, to := coordination.Sender(tc.subject, tc.from)
			require.Equal(t, [2]string{from, to}, [2]string{m.From, m.To}, "the console shows what the runs read")
		})
	}
}

// A steer's event reads as from the operator, with its id, outcome and
// reason, inert.
func TestCoordLiveSteered(t *testing.T) {
	t.Parallel()
	data := []byte(`{"kind":"steered","run_id":"r1","steer_id":"s1","outcome":"queued","bytes":5,"reason":"inbox only <b>"}`)
	le := coordLive(liveEvent{}, data)
	require.Equal(t, "steered", le.Kind)
	require.Equal(t, coordination.RecipientOperator, le.From)
	require.Equal(t, "steer s1 queued, 5 bytes: inbox only <b>", le.Text)
}
