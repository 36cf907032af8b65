package workspace

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// HeldWaitMax bounds exec's wait for JailArgs.Held; past it exec fails
// with ErrNotHeld (kind UnpackNotHeld, which the worker retries). The
// worker writes the file as soon as the capture container has started, or
// removes the run's container when it cannot start.
const HeldWaitMax = 10 * time.Minute

// heldPoll is how often exec looks for JailArgs.Held. The file is written
// from the host into a read-only bind mount: polling sees it under every
// OCI runtime (gVisor's file system included), which inotify would not.
const heldPoll = 2 * time.Millisecond

// execMain runs `jetcrew workspace exec` (see JailMain): it waits for the
// held file, unpacks the snapshot, restores the session, then replaces
// itself with a.Argv or, with a.Session, runs it as its child.
func execMain(a JailArgs, stderr io.Writer) int {
	// A stop (SIGTERM, SIGINT) before the command runs ends exec with 143,
	// but never in the middle of the unpack once the tree is held: the
	// capture then reads a whole tree, not a half-written one.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(stop)
	if a.Held != "" {
		switch waitHeld(fileExists(a.Held), HeldWaitMax, stop) {
		case heldStopped:
			return 143
		case heldTimedOut:
			fmt.Fprintln(stderr, JailFailure(a, fmt.Errorf("%w within %s", ErrNotHeld, HeldWaitMax)))
			return JailExitCode
		}
	}
	if err := JailUnpack(a); err != nil {
		fmt.Fprintln(stderr, JailFailure(a, err))
		return JailExitCode
	}
	if a.SessionIn != "" {
		if err := restoreSession(a.SessionIn, a.Session, a.SessionNames); err != nil {
			// The worker passed the CLI its resume flag: the run fails
			// here, saying why, rather than the CLI on a session it
			// cannot find.
			fmt.Fprintln(stderr, JailFailure(a, fmt.Errorf("session not restored: %w", err)))
			return JailExitCode
		}
	}
	select {
	case <-stop:
		return 143
	default:
	}
	signal.Stop(stop)
	NotifyStarted(a)
	if a.Session != "" {
		return runKeepingSession(a, stderr)
	}
	bin, err := exec.LookPath(a.Argv[0])
	if err == nil {
		err = syscall.Exec(bin, a.Argv, os.Environ())
	}
	fmt.Fprintf(stderr, "%sexec %s: %s\n", JailErrPrefix, a.Argv[0], oneLine(err.Error()))
	return 127
}

// StartedSocket is the name, in the directory of exec's held file (the run
// container's read-only gate directory), of the unix socket exec connects
// to once the tree is unpacked, just before the command starts
// (NotifyStarted): the worker learns there that the agent starts, and only
// then begins what would compete with the unpack for the CPU (the copy of
// the snapshot into the workspace bucket, a warm pool's refill).
const StartedSocket = "started"

// startedDialMax bounds exec's connection to StartedSocket.
const startedDialMax = time.Second

// NotifyStarted connects to the StartedSocket beside a.Held, when a has a
// held file, and hangs up: exec calls it once the tree is unpacked. A
// failure is ignored (the worker stops waiting after a while).
func NotifyStarted(a JailArgs) {
	if a.Held == "" {
		return
	}
	c, err := net.DialTimeout("unix", filepath.Join(filepath.Dir(a.Held), StartedSocket), startedDialMax)
	if err == nil {
		_ = c.Close()
	}
}

// Outcomes of waitHeld.
const (
	heldSeen = iota
	heldStopped
	heldTimedOut
)

// fileExists returns a function reporting whether path exists.
func fileExists(path string) func() bool {
	return func() bool {
		_, err := os.Stat(path)
		return err == nil
	}
}

// waitHeld asks held every heldPoll until it is true (heldSeen), a signal
// arrives on stop while it is not (heldStopped: the worker stopped the
// container before it held the tree, so nothing is unpacked), or max has
// passed (heldTimedOut). A signal that arrives once held is true is left
// on stop for the caller, who unpacks first.
func waitHeld(held func() bool, max time.Duration, stop chan os.Signal) int {
	deadline := time.Now().Add(max)
	for {
		if held() {
			return heldSeen
		}
		if time.Now().After(deadline) {
			return heldTimedOut
		}
		select {
		case sig := <-stop:
			if held() {
				// Held after all: unpack, then stop. Not blocking: a stop
				// that came meanwhile already fills the channel.
				select {
				case stop <- sig:
				default:
				}
				return heldSeen
			}
			return heldStopped
		case <-time.After(heldPoll):
		}
	}
}

// JailUnpack unpacks a.Snapshot into a.Dir with Unpack's rules and a's
// caps, as the calling user (no chown): inside a run's container, the run's
// user. With a held file (a.Held), the snapshot may still be arriving: the
// worker streams it in as it downloads, and JailUnpack follows it (a
// follower) until the gate says it is whole and checked
// (SnapshotCheckedFile) or refused (SnapshotRefusedFile, an error wrapping
// ErrSnapshotRefused), so the tree unpacks while the snapshot downloads
// and nothing after it runs before its digest is checked.
func JailUnpack(a JailArgs) error {
	f, err := os.Open(a.Snapshot)
	if err != nil {
		return err
	}
	defer f.Close()
	var r io.Reader = f
	if a.Held != "" {
		fr := &follower{f: f, path: a.Snapshot, gate: filepath.Dir(a.Held)}
		defer func() { fr.f.Close() }()
		r = fr
	}
	if err := Unpack(r, a.Dir, UnpackOptions{MaxBytes: a.MaxBytes, MaxFiles: a.MaxFiles}); err != nil {
		return err
	}
	if fr, ok := r.(*follower); ok {
		// The tar's end may come before the file's: the rest must be
		// there, and checked, before anything runs on the tree.
		if _, err := io.Copy(io.Discard, fr); err != nil {
			return err
		}
	}
	return nil
}

// Files the worker writes into a workspace run's gate directory (beside
// the held file) once the snapshot it streams into the input directory
// is whole: SnapshotCheckedFile when its bytes hash to the request's
// digest and its headers passed the worker's scan, SnapshotRefusedFile
// otherwise, holding "KIND\nREASON" (KIND UnpackRefused or UnpackFetch).
const (
	SnapshotCheckedFile = "checked"
	SnapshotRefusedFile = "refused"
)

// ErrSnapshotRefused is wrapped by JailUnpack's error when the worker
// refused the snapshot it was streaming (SnapshotRefusedFile).
var ErrSnapshotRefused = errors.New("the worker refused the snapshot")

// refusedError is a refusal read from SnapshotRefusedFile.
type refusedError struct{ kind, reason string }

func (e *refusedError) Error() string { return e.reason }
func (e *refusedError) Unwrap() error { return ErrSnapshotRefused }

// followPoll is how often a follower at the end of what has arrived looks
// again; followStallMax how long it waits for a byte or a verdict before
// it gives up (ErrNotHeld: retried).
const (
	followPoll     = time.Millisecond
	followStallMax = HeldWaitMax
)

// follower reads a snapshot file as the worker writes it: at its current
// end it waits until more arrives, and ends (io.EOF) only once the gate
// holds SnapshotCheckedFile and every byte was read. A file system that
// keeps a stale length for an open file (a sandbox's cache of a host
// file) is handled by opening the file again when its path says it grew.
type follower struct {
	f     *os.File
	path  string
	off   int64
	gate  string
	whole bool
}

func (r *follower) Read(p []byte) (int, error) {
	deadline := time.Now().Add(followStallMax)
	for {
		n, err := r.f.Read(p)
		r.off += int64(n)
		if n > 0 || err != io.EOF {
			return n, err
		}
		if fi, serr := os.Stat(r.path); serr == nil && fi.Size() > r.off {
			if err := r.reopen(); err != nil {
				return 0, err
			}
			if n, err = r.f.Read(p); n > 0 || err != io.EOF {
				r.off += int64(n)
				return n, err
			}
		}
		if r.whole {
			return 0, io.EOF
		}
		if _, err := os.Stat(filepath.Join(r.gate, SnapshotCheckedFile)); err == nil {
			r.whole = true // read again: the last bytes may have come meanwhile
			continue
		}
		if b, err := os.ReadFile(filepath.Join(r.gate, SnapshotRefusedFile)); err == nil {
			kind, reason, _ := strings.Cut(string(b), "\n")
			return 0, &refusedError{kind: kind, reason: oneLine(reason)}
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%w: no snapshot byte nor verdict within %s", ErrNotHeld, followStallMax)
		}
		time.Sleep(followPoll)
	}
}

// reopen opens the file again at the follower's offset.
func (r *follower) reopen() error {
	f, err := os.Open(r.path)
	if err != nil {
		return err
	}
	if _, err := f.Seek(r.off, io.SeekStart); err != nil {
		f.Close()
		return err
	}
	r.f.Close()
	r.f = f
	return nil
}

// UnpackKind names the kind of an Unpack error (UnpackNoSpace, ...).
func UnpackKind(err error) string {
	var refused *refusedError
	if errors.As(err, &refused) {
		if refused.kind == UnpackFetch {
			return UnpackFetch
		}
		return UnpackRefused
	}
	switch {
	case errors.Is(err, syscall.ENOSPC):
		return UnpackNoSpace
	case errors.Is(err, ErrTooLarge):
		return UnpackTooLarge
	case errors.Is(err, ErrBadArchive):
		return UnpackBadArchive
	case errors.Is(err, ErrNotHeld):
		return UnpackNotHeld
	}
	return UnpackOther
}
