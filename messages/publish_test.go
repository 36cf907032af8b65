package messages_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

func TestPublishEventWireGolden(t *testing.T) {
	t.Parallel()
	ev := messages.PublishEvent{RunID: "r1", Type: messages.EventPublish, Time: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC),
		Remote: "origin", URL: "https://git.example.com/acme/app.git", Branch: "agent/r1",
		Commit: "4dc2d701adfec4f756e7b0e8f3d55c1c4de8b364", Old: "0b2144a4763d577b78267b76e5a27377155a1646", Forced: true,
		PullRequest: "https://git.example.com/acme/app/pull/7"}
	b, err := json.MarshalIndent(ev, "", "  ")
	require.NoError(t, err)
	golden(t, "event-publish.json", append(b, '\n'))
	require.Equal(t, "jetcrew.events.r1.publish", messages.SubjectEvents("r1", messages.EventPublish))
}
