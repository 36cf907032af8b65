package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// watch prints refused egress attempts, one line each, and nothing for
// allowed ones.
func TestWatchPrintsEgressRefusals(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	p := &runPrinter{stdout: &out, stderr: &errOut, atLineStart: true}
	for _, ev := range []messages.EgressEvent{
		{Method: "CONNECT", Host: "api.anthropic.com", Port: 443, Allowed: true, BytesDown: 10},
		{Method: "CONNECT", Host: "evil.example", Port: 443, Reason: "not in the profile's egress allowlist"},
		{Reason: "too many connections to the run's egress proxy (at most 64 at once)"},
	} {
		b, err := json.Marshal(ev)
		require.NoError(t, err)
		require.NoError(t, p.print(dispatcher.WatchEvent{Type: messages.EventEgress, Data: b}))
	}
	require.Empty(t, out.String())
	require.Equal(t, "--- egress refused: CONNECT evil.example:443: not in the profile's egress allowlist\n"+
		"--- egress refused: too many connections to the run's egress proxy (at most 64 at once)\n", errOut.String())
}

// A refused attempt's method and host are the run's choice: shown escaped,
// one line whatever they hold.
func TestEgressRefusalEscaped(t *testing.T) {
	t.Parallel()
	var errOut bytes.Buffer
	p := &runPrinter{stdout: &bytes.Buffer{}, stderr: &errOut, atLineStart: true}
	b, err := json.Marshal(messages.EgressEvent{Method: "CONNECT\x1b]0;t\a", Host: "moc.elpmaxe\u202e.evil\nforged", Port: 443, Reason: "not allowed\u009b"})
	require.NoError(t, err)
	require.NoError(t, p.print(dispatcher.WatchEvent{Type: messages.EventEgress, Data: b}))
	require.Equal(t, `--- egress refused: CONNECT\x1b]0;t\a moc.elpmaxe\u202e.evil\nforged:443: not allowed\u009b`+"\n", errOut.String())
}

// status shows a run's egress totals, and nothing about egress for a run
// without them.
func TestStatusShowsEgress(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	require.NoError(t, printState(&b, messages.RunState{ID: "r1", State: messages.StateSucceeded,
		Egress: &messages.EgressTotals{Allowed: 3, Refused: 1, BytesUp: 10, BytesDown: 20}}))
	require.Contains(t, b.String(), "3 allowed, 1 refused, 10 bytes up, 20 bytes down")
	b.Reset()
	require.NoError(t, printState(&b, messages.RunState{ID: "r1", State: messages.StateSucceeded}))
	require.NotContains(t, b.String(), "egress")
}

// watch (and submit --wait) prints an allowed attempt whose host could not
// be reached or did not answer, with its cause, one line each.
func TestWatchPrintsEgressUpstreamFailures(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	p := &runPrinter{stdout: &out, stderr: &errOut, atLineStart: true}
	require.NoError(t, p.print(dispatcher.WatchEvent{Type: messages.EventOutput, Stream: messages.StreamStdout, Data: []byte("partial")}))
	for _, ev := range []messages.EgressEvent{
		{Method: "POST", Host: "api.anthropic.com", Port: 443, Allowed: true, BytesDown: 10},
		{Method: "POST", Host: "api.anthropic.com", Port: 443, Allowed: true,
			Reason: "upstream certificate not trusted: x509: certificate signed by unknown authority"},
		{Method: "CONNECT", Host: "pypi.org", Port: 443, Allowed: true, Reason: "upstream refused the connection\x1b[2J"},
	} {
		b, err := json.Marshal(ev)
		require.NoError(t, err)
		require.NoError(t, p.print(dispatcher.WatchEvent{Type: messages.EventEgress, Data: b}))
	}
	require.Equal(t, "partial", out.String())
	require.Equal(t, "\n--- egress upstream failed: POST api.anthropic.com:443: upstream certificate not trusted: x509: certificate signed by unknown authority\n"+
		`--- egress upstream failed: CONNECT pypi.org:443: upstream refused the connection\x1b[2J`+"\n", errOut.String())
}

// status counts a run's upstream failures with its egress totals.
func TestStatusShowsUpstreamFailures(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	require.NoError(t, printState(&b, messages.RunState{ID: "r1", State: messages.StateSucceeded,
		Egress: &messages.EgressTotals{Allowed: 3, Refused: 1, BytesUp: 10, BytesDown: 20, UpstreamFailed: 2}}))
	require.Contains(t, b.String(), "3 allowed, 1 refused, 10 bytes up, 20 bytes down, 2 upstream failures")
}
