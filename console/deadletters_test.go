package console

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
)

// Issue 27, bug 3: a group's "Sample request (the latest)" is the latest
// dead letter's request, and the letters listed carry no request bodies.
func TestGroupDeadLettersSample(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	dls := []dispatcher.DeadLetter{
		{Sequence: 1, RunID: "a", Pool: "default", Reason: "exit 1", Time: t0, Request: []byte(`{"prompt":"older"}`)},
		{Sequence: 2, RunID: "b", Pool: "default", Reason: "exit 1", Time: t0.Add(time.Minute), Request: []byte(`{"prompt":"<latest>"}`)},
		{Sequence: 3, RunID: "c", Pool: "gpu", Reason: "timed out", Time: t0, Request: []byte(`{"prompt":"alone"}`)},
	}
	groups := groupDeadLetters(dls)
	require.Len(t, groups, 2)
	require.Equal(t, "exit 1", groups[0].Reason)
	require.Equal(t, `{"prompt":"<latest>"}`, groups[0].Sample)
	require.Equal(t, `{"prompt":"alone"}`, groups[1].Sample)
	for _, g := range groups {
		for _, dl := range g.Letters {
			require.Nil(t, dl.Request, "only the sample carries a request")
		}
	}
}
