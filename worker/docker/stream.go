package docker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
)

// Stream ids in the multiplexed attach stream's frame headers (the framing
// of github.com/docker/docker/pkg/stdcopy).
const (
	frameStdin  = 0
	frameStdout = 1
	frameStderr = 2
	frameSystem = 3 // an error from the daemon, as text
)

// frameHeaderLen is the size of a frame header: the stream id, three zero
// bytes and the payload length as a big-endian uint32.
const frameHeaderLen = 8

// maxSystemFrame bounds how much of a daemon error frame is kept.
const maxSystemFrame = 64 << 10

// demux reads the multiplexed stream r (a non-TTY container's attach
// stream) frame by frame until EOF and calls out for each frame's payload,
// in the order the frames arrive, with messages.StreamStdout or
// messages.StreamStderr. A frame larger than messages.MaxOutputChunk is
// passed in consecutive pieces of at most that size, so p never exceeds it.
// p is only valid during the call.
//
// endFrame, when not nil, is called after each stdout or stderr frame with
// its stream, its size and its last byte (0 for an empty frame).
//
// demux returns nil at a clean EOF (between frames), io.ErrUnexpectedEOF when
// the stream ends inside a frame, an error carrying the daemon's message for
// a system-error frame, and otherwise the read error.
func demux(r io.Reader, out jail.OutputFunc, endFrame func(stream string, size int64, last byte)) error {
	var hdr [frameHeaderLen]byte
	buf := make([]byte, messages.MaxOutputChunk)
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		size := int64(binary.BigEndian.Uint32(hdr[4:]))
		var stream string
		switch hdr[0] {
		case frameStdin, frameStdout:
			// Stdin frames only appear on TTY-less exec with stdin
			// echoed; stdcopy also sends them to stdout.
			stream = messages.StreamStdout
		case frameStderr:
			stream = messages.StreamStderr
		case frameSystem:
			msg, err := io.ReadAll(io.LimitReader(r, min(size, maxSystemFrame)))
			if err != nil {
				return err
			}
			return fmt.Errorf("daemon error in output stream: %s", msg)
		default:
			return fmt.Errorf("output stream: unknown stream id %d in frame header", hdr[0])
		}
		var last byte
		for left := size; left > 0; {
			n := min(left, int64(len(buf)))
			got, err := io.ReadFull(r, buf[:n])
			if got > 0 {
				out(stream, buf[:got])
				last = buf[got-1]
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF
				}
				return err
			}
			left -= n
		}
		if endFrame != nil {
			endFrame(stream, size, last)
		}
	}
}
