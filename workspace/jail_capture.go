package workspace

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

// captureMain runs `jetcrew workspace capture` (see JailMain): with
// a.Wait it waits for SIGUSR1 first, reading the snapshot meanwhile; it
// writes the capture stream on stdout, then CaptureWrittenPrefix's line on
// stderr.
func captureMain(a JailArgs, stdout, stderr io.Writer) int {
	var pre <-chan *captureBase
	if a.Wait {
		stop := make(chan struct{})
		pre = preloadCapture(a, stop)
		signalled := waitForCapture(stderr, a.WaitMax)
		close(stop)
		if !signalled {
			return 143
		}
	}
	if err := a.ResolveRunID(); err != nil {
		fmt.Fprintln(stderr, JailFailure(a, err))
		return JailExitCode
	}
	ReportFull(a.Dir, stderr)
	out := &countWriter{w: stdout}
	if err := jailCapture(a, out, pre); err != nil {
		fmt.Fprintln(stderr, JailFailure(a, err))
		return JailExitCode
	}
	fmt.Fprintf(stderr, "%s%d\n", CaptureWrittenPrefix, out.n)
	return 0
}

// PreloadFile is the name, in the snapshot's directory (the capture
// container's input directory), of the file whose appearance lets a
// capture container waiting for its signal read the snapshot ahead of the
// capture (preloadCapture): the worker writes it once the snapshot, which
// may be streaming in, is whole and checked.
const PreloadFile = "preload"

// CaptureReadyLine is the line `jetcrew workspace capture --wait` prints
// on stderr once it handles SIGUSR1: a SIGUSR1 sent before would be lost
// (the Go runtime catches and ignores it until signal.Notify), so the
// worker waits for this line before it signals.
const CaptureReadyLine = JailErrPrefix + "capture waits for SIGUSR1"

// waitForCapture prints CaptureReadyLine on stderr and blocks until the
// process receives SIGUSR1 (true), or SIGTERM or max has passed (false;
// max 0: no bound).
func waitForCapture(stderr io.Writer, max time.Duration) bool {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1, syscall.SIGTERM)
	defer signal.Stop(ch)
	fmt.Fprintln(stderr, CaptureReadyLine)
	var timeout <-chan time.Time
	if max > 0 {
		timeout = time.After(max)
	}
	select {
	case sig := <-ch:
		return sig == syscall.SIGUSR1
	case <-timeout:
		fmt.Fprintf(stderr, "%scapture failed: no signal within %s\n", JailErrPrefix, max)
		return false
	}
}

// CaptureWrittenPrefix starts the line `jetcrew workspace capture` prints
// on stderr once it has written its whole stream to stdout and captured
// without error, followed by the stream's length in bytes: the worker
// takes the stream once it holds that many bytes, without waiting for the
// container's exit (stdout and stderr reach it on separate paths, so the
// line may come before the last bytes). Nothing is written after it but
// the exit, 0.
const CaptureWrittenPrefix = JailErrPrefix + "capture written, bytes: "

// FullLine is the line capture prints on stderr, before it reads the
// tree, when the workspace's file system has no space left: the run wrote
// up to its size (workspace_mib) or used up its inodes.
const FullLine = JailErrPrefix + "the workspace has no space left"

// ReportFull prints FullLine on stderr when the file system at dir has no
// block or no inode left for an unprivileged writer (statfs f_bavail or
// f_ffree is 0).
func ReportFull(dir string, stderr io.Writer) {
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) == nil && (st.Bavail == 0 || st.Ffree == 0) {
		fmt.Fprintln(stderr, FullLine)
	}
}

// JailCapture captures a.Dir against a.Snapshot (Capture, scratch in
// a.Scratch) and writes the result to w as a capture stream (see
// WriteCaptureStream).
func JailCapture(a JailArgs, w io.Writer) error { return jailCapture(a, w, nil) }

// jailCapture is JailCapture with the snapshot read by preloadCapture,
// when pre is not nil and gives a captureBase, else read now.
func jailCapture(a JailArgs, w io.Writer, pre <-chan *captureBase) error {
	o := a.captureOptions()
	var b *captureBase
	if pre != nil {
		b = <-pre
	}
	if b == nil {
		b = loadCaptureBase(o)
	}
	defer b.close()
	c, err := b.capture(a.Dir, o)
	if err != nil {
		return err
	}
	return WriteCaptureStream(w, c)
}

// captureOptions returns the options of capture's JailArgs.
func (a JailArgs) captureOptions() CaptureOptions {
	return CaptureOptions{RunID: a.RunID, Snapshot: a.Snapshot, Scratch: a.Scratch, MaxBytes: a.MaxBytes, MaxFiles: a.MaxFiles}
}

// snapshotPoll is how often a waiting capture looks for its snapshot
// (preloadCapture), which the worker links into the capture container's
// input directory once downloaded. The run's container starts after that,
// and the capture is needed only once it has ended.
const snapshotPoll = 10 * time.Millisecond

// preloadCapture reads the snapshot of a waiting capture while the run
// runs: once a.Snapshot exists (the worker links it into the capture
// container's input directory, whole, after the container started) and
// PreloadFile beside it (the snapshot is whole), both looked for every
// snapshotPoll, it loads it (loadCaptureBase) and sends the
// result on the channel it returns. When stop closes before the snapshot
// is there, it sends nil instead (the capture reads it then). The
// goroutine ends once it has sent; a load under way when stop closes is
// waited for, not begun again.
func preloadCapture(a JailArgs, stop <-chan struct{}) <-chan *captureBase {
	out := make(chan *captureBase, 1)
	snapshot, preload := fileExists(a.Snapshot), fileExists(filepath.Join(filepath.Dir(a.Snapshot), PreloadFile))
	exists := func() bool { return preload() && snapshot() }
	go func() {
		for !exists() {
			select {
			case <-stop:
				out <- nil
				return
			case <-time.After(snapshotPoll):
			}
		}
		out <- loadCaptureBase(a.captureOptions())
	}()
	return out
}
