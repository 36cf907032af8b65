package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// oneWay runs one command line with stdout and stderr on one writer, as
// `jetcrew … 2>&1` has them, and returns the exit code and what it wrote.
func oneWay(t *testing.T, url string, args ...string) (int, string) {
	t.Helper()
	a := newTestApp(map[string]string{"NATS_URL": url}, nil)
	a.app.stderr = a.app.stdout
	code := a.run(t.Context(), args)
	return code, a.stdout.String()
}

// watch and submit --wait show stdout and stderr in the order the worker
// read them (Jetcrew-Seq), even when the stream stored a chunk after later
// ones, and the finished line after all the output, on one pipe.
func TestWatchAndSubmitKeepOutputOrder(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	startWorker(t, s, "--id", "test-worker")
	url := s.ClientURL()

	js, err := jetstream.New(workertest.Connect(t, s))
	require.NoError(t, err)
	const id = "seq-watch"
	publish := func(typ messages.EventType, hdr map[string]string, data []byte) {
		m := nats.NewMsg(messages.SubjectEvents(id, typ))
		m.Data = data
		m.Header.Set(messages.HeaderRunID, id)
		m.Header.Set(messages.HeaderAttempt, "1")
		for k, v := range hdr {
			m.Header.Set(k, v)
		}
		_, err := js.PublishMsg(t.Context(), m)
		require.NoError(t, err)
	}
	output := func(stream string, offset, seq int, data string) {
		publish(messages.EventOutput, map[string]string{messages.HeaderStream: stream,
			messages.HeaderOffset: strconv.Itoa(offset), messages.HeaderSeq: strconv.Itoa(seq)}, []byte(data))
	}
	event := func(ev messages.Event) {
		ev.RunID, ev.Attempt, ev.Time = id, 1, time.Now()
		b, err := json.Marshal(ev)
		require.NoError(t, err)
		publish(ev.Type, nil, b)
	}
	kv, err := js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	st, err := json.Marshal(messages.RunState{Version: 1, ID: id, State: messages.StateFailed, ExitCode: new(3), Attempts: 1, FinishedAt: time.Now()})
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), id, st)
	require.NoError(t, err)
	event(messages.Event{Type: messages.EventStarted, Worker: "w1"})
	output(messages.StreamStdout, 0, 1, "1\n")
	output(messages.StreamStderr, 0, 2, "2\n")
	output(messages.StreamStderr, 2, 4, "4\n") // stored before 3: 3's first publish failed
	output(messages.StreamStdout, 2, 3, "3\n")
	event(messages.Event{Type: messages.EventFinished, State: messages.StateFailed, ExitCode: new(3)})

	code, got := oneWay(t, url, "watch", id)
	require.Equal(t, 3, code, got)
	require.Equal(t, "--- started: attempt 1 on worker w1\n1\n2\n3\n4\n--- finished: failed (exit code 3)\n", got)

	// A real run on the fake runtime, its streams written in turn.
	code, got = oneWay(t, url, "submit", "--wait", "out 1; err 2; out 3; err 4; exit 3")
	require.Equal(t, 3, code, got)
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	require.GreaterOrEqual(t, len(lines), 6, got)
	require.Equal(t, []string{"1", "2", "3", "4", "--- finished: failed (exit code 3: 4)"}, lines[len(lines)-5:], got)
}
