package main

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// A second submit of a used id within the duplicate window
// says so and exits non-zero instead of following the first run; a different
// body under a used id is refused, never merged with the first run.
func TestSubmitUsedIDSaysSo(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	startWorkerWith(t, s, workertest.NewTestRuntime(t), "--id", "w-dup", "--profiles", plainShellProfiles(t))
	url := s.ClientURL()

	code, _, stderr := cli(t, url, "submit", "--wait", "--id", "X", "out first; exit 3")
	require.Equal(t, 3, code, stderr)

	code, stdout, stderr := cli(t, url, "submit", "--wait", "--id", "X", "out second")
	require.Equal(t, 1, code)
	require.NotContains(t, stdout, "first", "the first run's output is not shown as the second's")
	require.Contains(t, stderr, "already used by a different request")
	require.Contains(t, stderr, "jetcrew replay X")

	code, stdout, stderr = cli(t, url, "submit", "--wait", "--id", "X", "out first; exit 3")
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "duplicate submit")
	require.NotContains(t, stderr, "--- finished")
}

// Replay uses only a dead letter a worker wrote for the run (its body is the
// request the run's state records), since whoever may publish on
// jetcrew.failed.> could otherwise have their request run under the run's
// id: a forged one on the run's subject, one for a run nobody ran and one
// naming another run are refused. A raw request reusing a failed run's id with another body is not
// a replay: the worker refuses it and the run stays as it was.
func TestReplayOnlyWorkerWrittenDeadLetters(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	rt := workertest.NewTestRuntime(t)
	startWorkerWith(t, s, rt, "--id", "w-replay", "--profiles", plainShellProfiles(t))
	url := s.ClientURL()
	nc := workertest.Connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	code, _, stderr := cli(t, url, "submit", "--wait", "--id", "victim", "exit 3")
	require.Equal(t, 3, code, stderr)
	forge := func(id, body string) {
		m := nats.NewMsg(messages.SubjectFailed("default", id))
		m.Data = []byte(body)
		m.Header.Set(messages.HeaderState, "failed")
		m.Header.Set(messages.HeaderWorker, "w-replay")
		_, err := js.PublishMsg(t.Context(), m)
		require.NoError(t, err)
	}
	// The genuine dead letter replays (and fails again), once the failed
	// run's container is gone.
	require.Eventually(t, func() bool { return rt.Live() == 0 }, 5*time.Second, 10*time.Millisecond)
	code, _, stderr = cli(t, url, "replay", "--wait", "victim")
	require.Equal(t, 3, code, stderr)

	forge("victim", `{"id":"victim","profile":"shell","prompt":"out EVIL"}`)
	forge("ghost", `{"id":"ghost","profile":"shell","prompt":"out EVIL"}`)
	forge("other", `{"id":"victim","profile":"shell","prompt":"out EVIL"}`)
	for id, want := range map[string]string{
		"victim": "is not the request the run's state records",
		"ghost":  "the run has no state",
		"other":  `its request names run "victim"`,
	} {
		code, _, stderr = cli(t, url, "replay", id)
		require.Equal(t, 1, code, id)
		require.Contains(t, stderr, "dead letter not written by a worker", id)
		require.Contains(t, stderr, want, id)
	}

	// Another body under the failed run's id, published raw.
	_, err = js.Publish(t.Context(), messages.SubjectRuns("default"), []byte(`{"id":"victim","profile":"shell","prompt":"out EVIL"}`))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		for _, m := range workertest.Events(t, js, "victim") {
			if m.Subject() == messages.SubjectEvents("victim", messages.EventDuplicate) {
				return strings.Contains(string(m.Data()), "already used by a different request")
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond)
	code, stdout, _ := cli(t, url, "watch", "victim")
	require.Equal(t, 3, code)
	require.NotContains(t, stdout, "EVIL")
	code, stdout, _ = cli(t, url, "status", "--json", "victim")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, `"replays": 1`)
}
