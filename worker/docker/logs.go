package docker

import (
	"context"
	"errors"
	"fmt"

	"github.com/docker/docker/api/types/container"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
)

// An adopted container's output comes from the engine's log of it
// (ContainerLogs) rather than from attach. Two faults of Docker Engine
// 20.10 are worked around here; neither changes anything on an engine
// without them (23.0 and later):
//
//   - its local driver drops the newline of a line it logged in parts
//     (newlineRepair puts it back where it can tell);
//   - its follow can end at the container's exit before the last messages
//     were read (the reader stops when the log closes, whether or not the
//     last write's file event was seen): copyLog reads the log once more
//     after the exit and passes what the follow missed.

// logLineMax is the most bytes of a line the engine keeps in one log
// message (the copier's buffer, defaultBufSize in moby's
// daemon/logger/copier.go): a longer line is logged as partial messages
// of exactly this size, then a last one with the rest.
const logLineMax = 16 << 10

// newlineRepair puts back, in a followed log, the newline Docker Engine
// 20.10's local log driver drops: reading a log, it appends the newline
// the copier took off a line only to a whole message, not to the last
// message of a line logged in parts (longer than logLineMax), so that
// line's newline is missing (moby fixed this in 23.0: read.go appends it
// when PLogMetaData.Last is set).
//
// A frame of the log that does not end with a newline is one of: a part
// of a long line (exactly logLineMax bytes, more follows), the last part
// of a long line whose newline the engine dropped (shorter), or what the
// process wrote without a newline before closing the stream (the
// stream's last frame). So a shorter frame without a newline followed by
// another frame of its stream lost its newline: newlineRepair passes one
// before that next frame. On an engine without the bug such a frame is
// never followed and nothing is added. What it cannot repair on 20.10: a
// stream's last line, when longer than logLineMax (the engine's log then
// reads as if it had no newline), and a line of an exact multiple of
// logLineMax bytes (whose last part is empty and sent as no frame).
type newlineRepair struct {
	out  jail.OutputFunc
	owed map[string]bool // by stream: a newline is owed before its next frame
}

func newNewlineRepair(out jail.OutputFunc) *newlineRepair {
	return &newlineRepair{out: out, owed: map[string]bool{}}
}

var newline = []byte{'\n'}

// output passes p on, after the newline owed to its stream, if any.
func (n *newlineRepair) output(stream string, p []byte) {
	if n.owed[stream] {
		n.owed[stream] = false
		n.out(stream, newline)
	}
	n.out(stream, p)
}

// endFrame notes whether the frame that ended may have lost its newline.
func (n *newlineRepair) endFrame(stream string, size int64, last byte) {
	n.owed[stream] = size > 0 && size < logLineMax && last != '\n'
}

// logTally counts the frames of a log read and each stream's bytes.
type logTally struct {
	frames int
	bytes  map[string]int64
}

func newLogTally() *logTally { return &logTally{bytes: map[string]int64{}} }

// copyLog follows the log (c.stream) into output through a newlineRepair
// until it ends, closes it and then, when the follow ended cleanly and
// followed a running container, waits for the exit and reads the log once
// more for what the follow missed (catchUp). bg ends the wait and that
// read (release cancels it).
func (c *Container) copyLog(bg context.Context, output jail.OutputFunc, running bool) {
	repair := newNewlineRepair(output)
	seen := newLogTally()
	err := demux(c.stream, func(stream string, p []byte) {
		seen.bytes[stream] += int64(len(p))
		repair.output(stream, p)
	}, func(stream string, size int64, last byte) {
		seen.frames++
		repair.endFrame(stream, size, last)
	})
	_ = c.stream.Close()
	if err == nil && running {
		select {
		case <-c.waitDone:
			err = c.waitErr
			if err == nil {
				err = c.catchUp(bg, seen, repair)
			}
		case <-bg.Done():
			err = bg.Err()
		}
	}
	c.copyErr = err
	close(c.copyDone)
}

// errLogRotated is the cause Wait reports when the log rotated while it
// was followed, so what the follow may have missed at the end cannot be
// told apart.
var errLogRotated = errors.New("the log rotated while followed; its end may be missing")

// catchUp reads the exited container's whole log (no follow) and passes,
// through repair, the frames past the seen.frames the follow passed. The
// frames it skips must hold as many bytes of each stream as the follow's:
// otherwise the log's oldest file rotated out meanwhile and the read does
// not start where the follow did (errLogRotated; nothing is passed).
func (c *Container) catchUp(ctx context.Context, seen *logTally, repair *newlineRepair) error {
	logs, err := c.rt.cli.ContainerLogs(ctx, c.id, container.LogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		return fmt.Errorf("read the log again after the exit: %w", classify(opLogs, err))
	}
	defer logs.Close()
	skipped := newLogTally()
	var misaligned bool
	err = demux(logs, func(stream string, p []byte) {
		switch {
		case misaligned:
		case skipped.frames < seen.frames:
			skipped.bytes[stream] += int64(len(p))
		default:
			repair.output(stream, p)
		}
	}, func(stream string, size int64, last byte) {
		if skipped.frames < seen.frames {
			skipped.frames++
			if skipped.frames == seen.frames && !sameBytes(skipped, seen) {
				misaligned = true
			}
			return
		}
		if !misaligned {
			repair.endFrame(stream, size, last)
		}
	})
	switch {
	case err != nil:
		return fmt.Errorf("read the log again after the exit: %w", err)
	case misaligned || skipped.frames < seen.frames:
		return errLogRotated
	}
	return nil
}

// sameBytes reports whether a and b counted as many bytes of each stream.
func sameBytes(a, b *logTally) bool {
	for _, s := range []string{messages.StreamStdout, messages.StreamStderr} {
		if a.bytes[s] != b.bytes[s] {
			return false
		}
	}
	return true
}
