package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

func TestVisibleString(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain text, ünïcode ✓\n\tnext": "plain text, ünïcode ✓\n\tnext",
		"\x1b]0;x\a\x1b[2K\r":           `\x1b]0;x\a\x1b[2K\r`,
		"a\x00b\x7fc\u009bd":            `a\x00b\x7fc\u009bd`,
		"evil\u202eexe.txt":             `evil\u202eexe.txt`,
		"bad \xff utf8":                 `bad \xff utf8`,
	} {
		require.Equal(t, want, visibleString(in), "%q", in)
	}
}

// A name is one field: newline and tab are escaped too.
func TestVisibleName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"report ünïcode ✓.txt":   "report ünïcode ✓.txt",
		"a\nb\tc":                `a\nb\tc`,
		"invoice\u202efdp.sh":    `invoice\u202efdp.sh`,
		"c1\u009b31m\u2067x\xff": `c1\u009b31m\u2067x\xff`,
	} {
		require.Equal(t, want, visibleName(in), "%q", in)
	}
}

// JSON output decodes to the same values, with nothing a terminal obeys.
func TestInertJSON(t *testing.T) {
	t.Parallel()
	v := map[string]string{"name": "invoice\u202efdp.sh", "c1": "\u009b2J\x7f", "esc": "\x1b[0m", "plain": "ünïcode ✓ <&>"}
	b, err := json.Marshal(v)
	require.NoError(t, err)
	out := inertJSON(b)
	require.NotContains(t, string(out), "\u202e")
	require.NotContains(t, string(out), "\u009b")
	require.NotContains(t, string(out), "\x7f")
	require.Contains(t, string(out), `invoice\u202efdp.sh`)
	var got map[string]string
	require.NoError(t, json.Unmarshal(out, &got))
	require.Equal(t, v, got)
}

// What a run wrote reaches the operator's terminal through
// status, failed and the lifecycle lines escaped; --json stays exact.
func TestHumanOutputEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	startWorker(t, s) // provisions the streams and bucket
	url := s.ClientURL()
	nc := workertest.Connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	hostile := "exit code 1: \x1b]0;pwned\a\x1b[2K\r"
	kv, err := js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	st := messages.RunState{Version: 1, ID: "esc", State: messages.StateFailed, Profile: "shell", Pool: "default",
		Reason: hostile, Labels: map[string]string{"k": "\x1b[31mred"}, UpdatedAt: time.Now()}
	data, err := json.Marshal(st)
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), "esc", data)
	require.NoError(t, err)
	m := nats.NewMsg(messages.SubjectFailed("default", "esc"))
	m.Data = []byte(`{"id":"esc","profile":"shell"}`)
	m.Header.Set(messages.HeaderError, hostile)
	m.Header.Set(messages.HeaderState, "failed")
	_, err = js.PublishMsg(t.Context(), m)
	require.NoError(t, err)

	for _, args := range [][]string{{"status", "esc"}, {"failed"}} {
		code, stdout, stderr := cli(t, url, args...)
		require.Equal(t, 0, code, stderr)
		require.NotContains(t, stdout, "\x1b", args)
		require.NotContains(t, stdout, "\a", args)
		require.Contains(t, stdout, `\x1b]0;pwned\a\x1b[2K`, args)
	}
	code, stdout, _ := cli(t, url, "status", "--json", "esc")
	require.Equal(t, 0, code)
	var got messages.RunState
	require.NoError(t, json.Unmarshal([]byte(stdout), &got))
	require.Equal(t, hostile, got.Reason, "JSON output stays exact")

	var b strings.Builder
	p := &runPrinter{stdout: &b, stderr: &b, atLineStart: true}
	require.NoError(t, p.print(dispatcher.WatchEvent{Type: messages.EventFinished, Event: messages.Event{Type: messages.EventFinished, State: messages.StateFailed, Reason: hostile}}))
	require.NotContains(t, b.String(), "\x1b")
	require.Contains(t, b.String(), `--- finished: failed (exit code 1: \x1b]0;pwned\a\x1b[2K\r)`)
}
