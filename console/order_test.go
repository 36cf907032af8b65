package console

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// The run page's live output shows stdout and stderr in the order the
// worker read them (Jetcrew-Seq), even when the stream stored a chunk after
// later ones, and before the finished event; each output event's seq is
// one the page has not shown yet.
func TestRunOutputInReadOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const id = "seq-page"
	publish := func(typ messages.EventType, hdr map[string]string, data []byte) {
		m := nats.NewMsg(messages.SubjectEvents(id, typ))
		m.Data = data
		m.Header.Set(messages.HeaderRunID, id)
		m.Header.Set(messages.HeaderAttempt, "1")
		for k, v := range hdr {
			m.Header.Set(k, v)
		}
		_, err := b.js.PublishMsg(t.Context(), m)
		require.NoError(t, err)
	}
	output := func(stream string, offset, seq int, data string) {
		publish(messages.EventOutput, map[string]string{messages.HeaderStream: stream,
			messages.HeaderOffset: strconv.Itoa(offset), messages.HeaderSeq: strconv.Itoa(seq)}, []byte(data))
	}
	for _, ev := range []messages.Event{{Type: messages.EventStarted}, {Type: messages.EventFinished, State: messages.StateFailed}} {
		ev.RunID, ev.Attempt, ev.Time = id, 1, time.Now()
		data, err := json.Marshal(ev)
		require.NoError(t, err)
		if ev.Type == messages.EventFinished {
			output(messages.StreamStdout, 0, 1, "1\n")
			output(messages.StreamStderr, 0, 2, "2\n")
			output(messages.StreamStderr, 2, 4, "4\n") // stored before 3: 3's first publish failed
			output(messages.StreamStdout, 2, 3, "3\n")
		}
		publish(ev.Type, nil, data)
	}

	stream := b.readSSE(t, "/live/run/"+id, 15*time.Second, func(s string) bool { return strings.Contains(s, `"type":"finished"`) })
	var got []string
	for _, m := range regexp.MustCompile(`event: (\w+)\ndata: (.*)\n`).FindAllStringSubmatch(stream, -1) {
		var le liveEvent
		require.NoError(t, json.Unmarshal([]byte(m[2]), &le), m[2])
		switch m[1] {
		case "output":
			got = append(got, le.Stream+":"+le.Text)
		case "event":
			got = append(got, le.Type)
		}
	}
	require.Equal(t, []string{"started", "stdout:1\n", "stderr:2\n", "stdout:3\n", "stderr:4\n", "finished"}, got, stream)
}
