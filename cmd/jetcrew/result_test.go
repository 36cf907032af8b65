package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// result prints refused names quoted, never a raw control character.
func TestPrintResultQuotesRefused(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	st := messages.RunState{ID: "r1", State: messages.StateSucceeded, WorkspaceResult: &messages.WorkspaceResult{
		Head: "4dc2d701adfec4f756e7b0e8f3d55c1c4de8b364", Error: "2 paths left out",
		Refused: []string{"esc\x1b[31mred.txt"}, RefusedCount: 2,
	}}
	require.NoError(t, printResult(&b, st))
	require.Contains(t, b.String(), "refused \"esc\\x1b[31mred.txt\"\n")
	require.Contains(t, b.String(), "refused: 1 more\n")
	require.NotContains(t, b.String(), "\x1b")
}
