package docker

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/docker/docker/pkg/stdcopy"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// chunk is one OutputFunc call.
type chunk struct {
	stream string
	data   string
}

// collect returns an OutputFunc that records its calls into *got.
func collect(got *[]chunk) func(string, []byte) {
	return func(stream string, p []byte) {
		*got = append(*got, chunk{stream, string(p)})
	}
}

// frames builds a multiplexed stream the way the daemon does.
func frames(t *testing.T, parts ...chunk) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	out := stdcopy.NewStdWriter(&buf, stdcopy.Stdout)
	errw := stdcopy.NewStdWriter(&buf, stdcopy.Stderr)
	for _, p := range parts {
		w := out
		if p.stream == messages.StreamStderr {
			w = errw
		}
		_, err := w.Write([]byte(p.data))
		require.NoError(t, err)
	}
	return &buf
}

func TestDemuxKeepsFrameOrder(t *testing.T) {
	t.Parallel()

	want := []chunk{
		{messages.StreamStdout, "out 1\n"},
		{messages.StreamStderr, "err 1\n"},
		{messages.StreamStderr, "err 2\n"},
		{messages.StreamStdout, "\xff\xfe\x00binary"},
		{messages.StreamStderr, "err 3"},
	}
	var got []chunk
	require.NoError(t, demux(frames(t, want...), collect(&got), nil))
	require.Equal(t, want, got)
}

func TestDemuxSplitsLargeFrames(t *testing.T) {
	t.Parallel()

	big := strings.Repeat("0123456789abcdef", (3*messages.MaxOutputChunk+100)/16)
	var got []chunk
	require.NoError(t, demux(frames(t, chunk{messages.StreamStdout, big}), collect(&got), nil))
	var joined strings.Builder
	for _, c := range got {
		require.Equal(t, messages.StreamStdout, c.stream)
		require.LessOrEqual(t, len(c.data), messages.MaxOutputChunk)
		joined.WriteString(c.data)
	}
	require.Len(t, got, 4)
	require.Equal(t, big, joined.String())
}

func TestDemuxEmptyStream(t *testing.T) {
	t.Parallel()

	var got []chunk
	require.NoError(t, demux(bytes.NewReader(nil), collect(&got), nil))
	require.Empty(t, got)
}

func TestDemuxTruncated(t *testing.T) {
	t.Parallel()

	full := frames(t, chunk{messages.StreamStdout, "hello"}, chunk{messages.StreamStderr, "world"}).Bytes()

	t.Run("inside payload", func(t *testing.T) {
		t.Parallel()
		var got []chunk
		err := demux(bytes.NewReader(full[:len(full)-2]), collect(&got), nil)
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
		require.Equal(t, []chunk{{messages.StreamStdout, "hello"}, {messages.StreamStderr, "wor"}}, got,
			"bytes read before the break are still delivered")
	})
	t.Run("inside header", func(t *testing.T) {
		t.Parallel()
		var got []chunk
		err := demux(bytes.NewReader(full[:8+5+3]), collect(&got), nil)
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
		require.Equal(t, []chunk{{messages.StreamStdout, "hello"}}, got)
	})
}

func TestDemuxSystemError(t *testing.T) {
	t.Parallel()

	buf := frames(t, chunk{messages.StreamStdout, "partial"})
	_, err := stdcopy.NewStdWriter(buf, stdcopy.Systemerr).Write([]byte("boom"))
	require.NoError(t, err)
	var got []chunk
	err = demux(buf, collect(&got), nil)
	require.ErrorContains(t, err, "daemon error in output stream: boom")
	require.Equal(t, []chunk{{messages.StreamStdout, "partial"}}, got)
}

func TestDemuxUnknownStream(t *testing.T) {
	t.Parallel()

	err := demux(bytes.NewReader([]byte{9, 0, 0, 0, 0, 0, 0, 1, 'x'}), func(string, []byte) {}, nil)
	require.ErrorContains(t, err, "unknown stream id 9")
}

func FuzzDemux(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 2, 'h', 'i', 2, 0, 0, 0, 0, 0, 0, 1, '!'})
	f.Add([]byte{3, 0, 0, 0, 0, 0, 0, 3, 'e', 'r', 'r'})
	f.Add([]byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		var total int
		err := demux(bytes.NewReader(data), func(stream string, p []byte) {
			if stream != messages.StreamStdout && stream != messages.StreamStderr {
				t.Fatalf("stream %q", stream)
			}
			if len(p) == 0 || len(p) > messages.MaxOutputChunk {
				t.Fatalf("chunk of %d bytes", len(p))
			}
			total += len(p)
		}, nil)
		if total > len(data) {
			t.Fatalf("delivered %d bytes from %d", total, len(data))
		}
		_ = err
	})
}
