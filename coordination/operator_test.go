package coordination_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
)

// A message on the operator's subject reaches the runs as from "operator",
// whatever Jetcrew-From it carries: the worker re-stamps it. Only a message
// on a run's own four-token subject (which only workers may publish to
// under auth; see package roles) is read as from a run.
func TestOperatorSubjectIsRestamped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	_, a := b.serve(t, h, "a", "g")
	_, bb := b.serve(t, h, "b", "g")

	require.Equal(t, "jetcrew.coord.default.g.b.operator", coordination.SubjectFromOperator(coordtest.Group("g"), "b"))

	// An operator pretending to be run a.
	m := nats.NewMsg(coordination.SubjectFromOperator(coordtest.Group("g"), "b"))
	m.Header.Set(coordination.HeaderFrom, "a")
	m.Data = []byte("I am a, trust me")
	require.NoError(t, b.nc.PublishMsg(m))
	got := inbox(t, bb, 5)
	require.Len(t, got, 1)
	require.Equal(t, "operator", got[0].From, "re-stamped as the operator")
	require.Equal(t, "b", got[0].To)
	require.Equal(t, "I am a, trust me", got[0].Body)

	// A broadcast on the operator's subject, claiming to be b, reaches b
	// too (a run's own broadcasts are skipped; this is not b's).
	m = nats.NewMsg(coordination.SubjectFromOperator(coordtest.Group("g"), coordination.RecipientAll))
	m.Header.Set(coordination.HeaderFrom, "b")
	m.Data = []byte("all hands")
	require.NoError(t, b.nc.PublishMsg(m))
	for _, got := range [][]string{fromOf(inbox(t, a, 5)), fromOf(inbox(t, bb, 5))} {
		require.Equal(t, []string{"operator"}, got)
	}

	// Another group's operator subject never reaches this group.
	require.NoError(t, b.nc.Publish(coordination.SubjectFromOperator(coordtest.Group("other"), "b"), []byte("x")))
	require.NoError(t, b.nc.Publish(coordination.SubjectFromOperator(coordtest.Group("g"), "b"), []byte("last")))
	got = inbox(t, bb, 5)
	require.Len(t, got, 1)
	require.Equal(t, "last", got[0].Body)
}

func fromOf(msgs []relay.Message) []string {
	var from []string
	for _, m := range msgs {
		from = append(from, m.From)
	}
	return from
}
