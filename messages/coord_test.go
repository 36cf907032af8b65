package messages

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCoordNames: the coordination subjects and the JSON of a coordination
// event, as a client that imports only this package sees them.
func TestCoordNames(t *testing.T) {
	t.Parallel()
	g := GroupRef{Pool: "default", Name: "team"}
	require.Equal(t, "jetcrew.coord.default.team.all", SubjectCoord(g, RecipientAll))
	require.Equal(t, "jetcrew.coord.default.team.>", SubjectCoordGroup(g))
	require.Equal(t, "jetcrew.coord.default.team.r1.operator", SubjectCoordFromOperator(g, "r1"))
	// The same name in another pool is another group.
	require.Equal(t, "jetcrew.coord.gpu.team.all", SubjectCoord(GroupRef{Pool: "gpu", Name: "team"}, RecipientAll))
	require.Equal(t, "ask.default.team.r1.q1", CoordQuestionKey(g, "r1", "q1"))
	require.Equal(t, "ask.*.*.*.q1", CoordQuestionByID("q1"))
	require.Equal(t, "/run/jetcrew/bridge.sock", ContainerSocketPath)
	require.Equal(t, "/run/jetcrew/mcp.json", ContainerMCPConfigPath)
	b, err := json.Marshal(CoordEvent{RunID: "r1", Group: "g", Kind: CoordSent, Time: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		To: "r2", MessageID: "m1", Bytes: 5})
	require.NoError(t, err)
	require.JSONEq(t, `{"run_id":"r1","group":"g","kind":"sent","time":"2026-12-01T00:00:00Z","to":"r2","message_id":"m1","bytes":5}`, string(b))
}
