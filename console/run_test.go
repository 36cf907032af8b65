package console

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// Issue 27, bug 5: a run page open while its run ends (or is replayed)
// gets, with the state, everything the page shows of it: exit code,
// start and finish, output size, attempts, worker, result and receipt.
func TestRunPageLiveCarriesFinalFields(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	now := time.Now().UTC().Truncate(time.Millisecond)
	st := messages.RunState{ID: "final-1", State: messages.StateRunning, Pool: "default", Profile: "shell",
		Worker: "w-1", Attempts: 1, QueuedAt: now, StartedAt: now.Add(time.Second), UpdatedAt: now.Add(time.Second)}
	b.putStates(t, st)
	rev := b.c.cache.current()

	exit := 3
	st.State, st.Reason, st.ExitCode, st.OutputBytes = messages.StateFailed, "exit code 3", &exit, 42
	st.FinishedAt, st.UpdatedAt, st.Replays = now.Add(2*time.Second), now.Add(2*time.Second), 1
	st.Result = "done <b>"
	st.Receipt = &messages.Receipt{Profile: "shell", Image: "busybox"}
	stream := b.readSSEOpened(t, "/live/run/final-1?rev="+strconv.FormatUint(rev, 10), 10*time.Second, func() {
		b.putStates(t, st)
	}, func(s string) bool { return strings.Contains(s, `"state":"failed"`) })
	var got map[string]any
	for line := range strings.Lines(stream) {
		if data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok && strings.Contains(data, `"state":"failed"`) {
			require.NoError(t, json.Unmarshal([]byte(data), &got))
		}
	}
	require.Equal(t, "failed", got["state"])
	require.Equal(t, "3", got["exit_code"])
	require.Equal(t, clock(st.StartedAt), got["started"])
	require.Equal(t, clock(st.FinishedAt), got["finished"])
	require.Equal(t, "42 bytes", got["output"])
	require.Equal(t, "1, replayed 1×", got["attempts"])
	require.Equal(t, "w-1", got["worker"])
	require.Equal(t, "done <b>", got["result"])
	require.Contains(t, got["receipt"], `"image": "busybox"`)

	// The page rendered has a place for each, filled by the stream.
	code, body := b.get(t, "/runs/final-1")
	require.Equal(t, 200, code)
	for _, id := range []string{"exit-code", "started", "finished", "output-bytes", "attempts", "worker", "result", "receipt"} {
		require.Contains(t, body, `id="`+id+`"`)
	}
}

// Issue 38: a run adopted by a successor of its worker says so: its
// attempts ("1, adopted 1×", the same attempt), on the page and live, and
// its adopted event (from which worker, after how long unwatched).
func TestRunPageAdopted(t *testing.T) {
	t.Parallel()
	st := messages.RunState{ID: "adopted-1", State: messages.StateRunning, Attempts: 1, Adoptions: 1}
	require.Equal(t, "1, adopted 1×", attemptsText(st))
	st.Replays = 2
	require.Equal(t, "1, replayed 2×, adopted 1×", attemptsText(st))
	name, le := toLive(dispatcher.WatchEvent{Type: messages.EventAdopted,
		Event: messages.Event{RunID: "adopted-1", Type: messages.EventAdopted, Worker: "w-2", AdoptedFrom: "w-1", GapMS: 1234}}, nil)
	require.Equal(t, "event", name)
	require.Equal(t, "w-2", le.Kind)
	require.Equal(t, "from w-1, after 1.23s unwatched", le.Text)
}
