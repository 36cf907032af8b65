package bridgecmd

import (
	"bufio"
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// A waiting launcher answers every probe of the worker and returns the
// first line that is none: the hand-off. The worker closing without a run
// is an EOF with nothing read.
func TestReadHandoffAnswersProbes(t *testing.T) {
	t.Parallel()
	worker, launcher := net.Pipe()
	defer worker.Close()
	got := make(chan string, 1)
	go func() {
		line, err := readHandoff(launcher)
		if err != nil {
			line = []byte(err.Error())
		}
		got <- string(line)
	}()
	rd := bufio.NewReader(worker)
	for range 2 {
		_, err := io.WriteString(worker, messages.HandoffProbe)
		require.NoError(t, err)
		answer, err := rd.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, messages.HandoffAlive, answer)
	}
	_, err := io.WriteString(worker, `{"argv":["true"]}`+"\n")
	require.NoError(t, err)
	require.Equal(t, `{"argv":["true"]}`+"\n", <-got)

	worker2, launcher2 := net.Pipe()
	require.NoError(t, worker2.Close())
	line, err := readHandoff(launcher2)
	require.ErrorIs(t, err, io.EOF)
	require.Empty(t, line)
}
