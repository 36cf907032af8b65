package docker

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// joined returns what the chunks hold of each stream.
func joined(got []chunk) (stdout, stderr string) {
	var out, errOut strings.Builder
	for _, c := range got {
		if c.stream == messages.StreamStdout {
			out.WriteString(c.data)
		} else {
			errOut.WriteString(c.data)
		}
	}
	return out.String(), errOut.String()
}

// TestNewlineRepair: a frame shorter than logLineMax without a newline
// that its stream follows with another frame (Engine 20.10's local driver
// dropped the newline of a long line's last part) gets its newline before
// that frame; parts of exactly logLineMax bytes, frames ending in a
// newline and a stream's last frame get none.
func TestNewlineRepair(t *testing.T) {
	t.Parallel()
	part := strings.Repeat("x", logLineMax)
	var got []chunk
	r := newNewlineRepair(collect(&got))
	err := demux(frames(t,
		chunk{messages.StreamStdout, part},     // part of a long line
		chunk{messages.StreamStdout, "rest"},   // its last part, newline dropped
		chunk{messages.StreamStderr, "e\n"},    // the other stream between
		chunk{messages.StreamStdout, "next\n"}, // the next line: the newline first
		chunk{messages.StreamStderr, part},
		chunk{messages.StreamStderr, "end"}, // the stream's last: written so
		chunk{messages.StreamStdout, "no newline at exit"},
	), r.output, r.endFrame)
	require.NoError(t, err)
	out, errOut := joined(got)
	require.Equal(t, part+"rest\nnext\nno newline at exit", out)
	require.Equal(t, "e\n"+part+"end", errOut)
}

// logsFake answers ContainerLogs (no follow) with log, multiplexed.
type logsFake struct {
	fakeClient
	log []byte
}

func (f *logsFake) ContainerLogs(_ context.Context, _ string, opts container.LogsOptions) (io.ReadCloser, error) {
	if opts.Follow || !opts.ShowStdout || !opts.ShowStderr {
		panic("the catch-up reads both streams without following")
	}
	return io.NopCloser(bytes.NewReader(f.log)), nil
}

// TestCopyLogCatchesUp: when the follow of a running container ends
// before the log's last messages (Engine 20.10), they are read again
// after the exit and passed, the follow's frames skipped, a newline the
// engine dropped put back across the two reads; when the log no longer
// starts where the follow did (rotated), nothing is passed and the
// output is reported incomplete.
func TestCopyLogCatchesUp(t *testing.T) {
	t.Parallel()
	part := strings.Repeat("x", logLineMax)
	log := []chunk{
		{messages.StreamStdout, "one\n"},
		{messages.StreamStderr, "e1\n"},
		{messages.StreamStdout, part},
		{messages.StreamStdout, "end of a long line"}, // the follow stops here
		{messages.StreamStderr, "e2\n"},
		{messages.StreamStdout, "last"},
	}
	for _, tt := range []struct {
		name            string
		catchUp         []chunk
		wantOut, wantEr string
		wantErr         error
	}{
		{"caught up", log, "one\n" + part + "end of a long line\nlast", "e1\ne2\n", nil},
		{"rotated", log[1:], "one\n" + part + "end of a long line", "e1\n", errLogRotated},
		{"shorter", log[:2], "one\n" + part + "end of a long line", "e1\n", errLogRotated},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := &Container{id: "c1", rt: newRuntime(&logsFake{log: frames(t, tt.catchUp...).Bytes()}, Config{}.withDefaults()),
				stream: io.NopCloser(frames(t, log[:4]...)), waitDone: make(chan struct{}), copyDone: make(chan struct{})}
			close(c.waitDone) // exited
			var got []chunk
			c.copyLog(context.Background(), collect(&got), true)
			<-c.copyDone
			require.ErrorIs(t, c.copyErr, tt.wantErr)
			out, errOut := joined(got)
			require.Equal(t, tt.wantOut, out)
			require.Equal(t, tt.wantEr, errOut)
		})
	}
}
