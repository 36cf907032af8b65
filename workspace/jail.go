package workspace

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
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

	"github.com/jetcrew/jetcrew/messages"
)

// The in-jail commands. A worker never unpacks a snapshot nor reads a run's
// tree itself: it prefixes the run's command with `jetcrew workspace exec`
// (unpack as the run's user, then exec the agent) and runs `jetcrew
// workspace capture --wait` in a second container of the same hardening,
// started during staging (it holds the tree's volume mounted; exec waits
// until it has started), which captures once signalled after the run's
// container has exited, the result one tar stream on stdout
// (docs/workspaces.md, "Where each step runs").

// JailExitCode is the exit code of `jetcrew workspace exec` and `jetcrew
// workspace capture` when they fail; the last line of their stderr then
// starts with JailErrPrefix and says why.
const JailExitCode = 121

// JailErrPrefix starts the line the in-jail commands print on stderr when
// they fail. `jetcrew workspace exec` prints
// "jetcrew workspace: unpack failed (KIND): DETAIL", KIND one of the Unpack
// failure kinds below.
const JailErrPrefix = "jetcrew workspace: "

// Kinds of unpack failure, as `jetcrew workspace exec` prints them.
const (
	// UnpackNoSpace: the tree's file system is full (ENOSPC), a
	// workspace_mib too small for the snapshot.
	UnpackNoSpace = "no-space"
	// UnpackTooLarge: the snapshot is over the worker's bytes or files cap
	// (ErrTooLarge).
	UnpackTooLarge = "too-large"
	// UnpackBadArchive: the snapshot is not a valid workspace snapshot
	// (ErrBadArchive).
	UnpackBadArchive = "bad-archive"
	// UnpackNotHeld: no capture container held the workspace within
	// HeldWaitMax (ErrNotHeld): an infrastructure failure, retried.
	UnpackNotHeld = "not-held"
	// UnpackOther: any other failure (a missing snapshot mount, EIO).
	UnpackOther = "error"
	// UnpackRefused: the worker refused the snapshot it was streaming in
	// (its bytes are not the digest's, or its headers failed the scan):
	// retrying cannot help.
	UnpackRefused = "refused"
	// UnpackFetch: the worker could not fetch the snapshot it was
	// streaming in (the store, or a broken copy): retried.
	UnpackFetch = "fetch"
)

// ErrNotHeld is exec's failure when the held file (JailArgs.Held) did not
// appear within HeldWaitMax.
var ErrNotHeld = errors.New("the workspace was not held by a capture container")

// JailArgs are the arguments of an in-jail command.
type JailArgs struct {
	// Command is "exec" or "capture".
	Command string
	// Snapshot is the snapshot tar's path (read-only in the container).
	Snapshot string
	// Dir is the workspace tree (messages.WorkspaceDir).
	Dir string
	// Scratch is capture's private, empty, writable object store directory.
	Scratch string
	// RunID names the bundle's ref (capture).
	RunID string
	// RunIDFile, for capture instead of RunID, is a file holding the run
	// id, read once signalled (Wait): a capture container started with a
	// warm container, before any run claimed it, learns its run there.
	RunIDFile string
	// MaxBytes and MaxFiles are the worker's caps (UnpackOptions,
	// CaptureOptions); 0 means none.
	MaxBytes int64
	MaxFiles int
	// Argv is exec's command, the arguments after "--".
	Argv []string
	// Wait makes capture wait for SIGUSR1 before it reads the tree (a
	// SIGTERM first ends it with exit code 143): the worker starts the
	// capture container during staging, and the run's exec waits (Held)
	// until it has started, so that the workspace volume stays mounted,
	// its content kept, between the run's end and the capture.
	Wait bool
	// WaitMax bounds that wait (0: none); past it capture exits 143, so a
	// capture container a worker left behind (it crashed) gives the
	// volume's memory back on its own.
	WaitMax time.Duration
	// Held, for exec, is a file whose appearance says the workspace volume
	// is held by the capture container: exec waits for it (at most
	// HeldWaitMax) before it unpacks and execs the command, so the run's
	// container, started while the capture container may still be
	// starting, neither writes the tree nor ends (unmounting it) before the
	// capture container holds it. "" means no wait.
	Held string
	// Session, for exec, is the container path of the agent CLI's session
	// directory (profile.Plan.SessionDir): exec then runs the command as
	// its child and, once it exited, keeps a copy of the directory in the
	// workspace's messages.SessionDir (session.go). "" runs the command in
	// exec's place, keeping nothing.
	Session string
	// SessionIn, for exec with Session, is an earlier run's
	// messages.ResultSession object (read-only), restored into Session
	// before the command starts: a follow-up.
	SessionIn string
	// SessionNames, for exec with Session, says which entries of Session
	// are kept and restored (profile.Plan's SessionKeep and SessionSkip).
	SessionNames SessionNames
}

// HeldWaitMax bounds exec's wait for JailArgs.Held; past it exec fails
// with ErrNotHeld (kind UnpackNotHeld, which the worker retries). The
// worker writes the file as soon as the capture container has started, or
// removes the run's container when it cannot start.
const HeldWaitMax = 10 * time.Minute

// heldPoll is how often exec looks for JailArgs.Held. The file is written
// from the host into a read-only bind mount: polling sees it under every
// OCI runtime (gVisor's file system included), which inotify would not.
const heldPoll = 2 * time.Millisecond

// ParseJailArgs parses the arguments after "workspace": a command (exec or
// capture) and its flags; exec takes its argv after "--". It returns an
// error for an unknown command or flag, or an exec without argv.
func ParseJailArgs(args []string) (JailArgs, error) {
	var a JailArgs
	if len(args) == 0 || (args[0] != "exec" && args[0] != "capture") {
		return a, errors.New("usage: jetcrew workspace exec|capture [flags] [-- ARGV...]")
	}
	a.Command = args[0]
	fs := flag.NewFlagSet("workspace "+a.Command, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&a.Snapshot, "snapshot", "", "snapshot tar")
	fs.StringVar(&a.Dir, "dir", messages.WorkspaceDir, "workspace tree")
	fs.StringVar(&a.Scratch, "scratch", "", "capture's scratch directory")
	fs.StringVar(&a.RunID, "run-id", "", "run id (capture)")
	fs.StringVar(&a.RunIDFile, "run-id-file", "", "capture: a file holding the run id, read once signalled")
	fs.Int64Var(&a.MaxBytes, "max-bytes", 0, "bytes cap")
	fs.IntVar(&a.MaxFiles, "max-files", 0, "files cap")
	fs.BoolVar(&a.Wait, "wait", false, "capture: wait for SIGUSR1 first")
	fs.DurationVar(&a.WaitMax, "wait-max", 0, "capture: bound of the wait for SIGUSR1")
	fs.StringVar(&a.Held, "held", "", "exec: wait for this file before unpacking")
	fs.StringVar(&a.Session, "session", "", "exec: the agent CLI's session directory, kept in the workspace once the command exited")
	fs.StringVar(&a.SessionIn, "session-in", "", "exec: a session tar restored into --session before the command starts")
	fs.Func("session-keep", "exec: a pattern of the names directly in --session kept (repeatable; none: all)", func(v string) error {
		a.SessionNames.Keep = append(a.SessionNames.Keep, v)
		return checkSessionName("session-keep", v, true)
	})
	fs.Func("session-skip", "exec: a name directly in --session never kept (repeatable)", func(v string) error {
		a.SessionNames.Skip = append(a.SessionNames.Skip, v)
		return checkSessionName("session-skip", v, false)
	})
	if err := fs.Parse(args[1:]); err != nil {
		return a, fmt.Errorf("workspace %s: %w", a.Command, err)
	}
	a.Argv = fs.Args()
	switch {
	case a.Snapshot == "":
		return a, fmt.Errorf("workspace %s: --snapshot is required", a.Command)
	case a.Command == "exec" && len(a.Argv) == 0:
		return a, errors.New("workspace exec: no command after --")
	case a.SessionIn != "" && a.Session == "", a.Session != "" && !filepath.IsAbs(a.Session):
		return a, fmt.Errorf("workspace %s: --session-in needs --session, an absolute path", a.Command)
	case a.Command == "capture" && (a.Scratch == "" || (a.RunID == "") == (a.RunIDFile == "") || len(a.Argv) > 0):
		return a, errors.New("workspace capture: --scratch and one of --run-id and --run-id-file are required, and no arguments")
	case a.RunIDFile != "" && !a.Wait:
		return a, errors.New("workspace capture: --run-id-file needs --wait")
	}
	return a, nil
}

// ArgList returns the argument list (after the binary's path) that runs a:
// what ParseJailArgs reads back, "workspace" first.
func (a JailArgs) ArgList() []string {
	out := []string{"workspace", a.Command, "--snapshot", a.Snapshot, "--dir", a.Dir,
		"--max-bytes", fmt.Sprint(a.MaxBytes), "--max-files", fmt.Sprint(a.MaxFiles)}
	if a.Command == "capture" {
		out = append(out, "--scratch", a.Scratch)
		if a.RunIDFile != "" {
			out = append(out, "--run-id-file", a.RunIDFile)
		} else {
			out = append(out, "--run-id", a.RunID)
		}
		if a.Wait {
			out = append(out, "--wait")
		}
		if a.WaitMax > 0 {
			out = append(out, "--wait-max", a.WaitMax.String())
		}
		return out
	}
	if a.Held != "" {
		out = append(out, "--held", a.Held)
	}
	if a.Session != "" {
		out = append(out, "--session", a.Session)
	}
	if a.SessionIn != "" {
		out = append(out, "--session-in", a.SessionIn)
	}
	for _, n := range a.SessionNames.Keep {
		out = append(out, "--session-keep", n)
	}
	for _, n := range a.SessionNames.Skip {
		out = append(out, "--session-skip", n)
	}
	return append(append(out, "--"), a.Argv...)
}

// JailMain runs an in-jail command (args after "workspace") and returns the
// process's exit code: exec never returns when it succeeds (the process is
// replaced by a.Argv), unless given --session, when it runs a.Argv as its
// child, keeps the session and returns (or dies) as the child did
// (session.go); a failure prints one line starting with
// JailErrPrefix on stderr and returns JailExitCode (127 when the command to
// exec cannot be run, as a shell does; 2 for bad arguments).
func JailMain(args []string, stdout, stderr io.Writer) int {
	a, err := ParseJailArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "%s%s\n", JailErrPrefix, oneLine(err.Error()))
		return 2
	}
	if a.Command == "capture" {
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

// ResolveRunID sets a.RunID from the file a.RunIDFile names, when set: one
// token (messages.ValidateToken), a trailing newline allowed. Capture calls
// it once signalled. Its error says the file is unreadable or not a run
// id.
func (a *JailArgs) ResolveRunID() error {
	if a.RunIDFile == "" {
		return nil
	}
	b, err := os.ReadFile(a.RunIDFile)
	if err != nil {
		return fmt.Errorf("run id: %w", err)
	}
	id := strings.TrimSuffix(string(b), "\n")
	if err := messages.ValidateToken("run id", id); err != nil {
		return err
	}
	a.RunID = id
	return nil
}

// StartedSocket is the name, in the directory of exec's held file (the run
// container's read-only gate directory), of the unix socket exec connects
// to once the tree is unpacked, just before the command starts
// (NotifyStarted): the worker learns there that the agent starts, and only
// then begins what would compete with the unpack for the CPU (the copy of
// the snapshot into the workspace bucket, a warm pool's refill).
const StartedSocket = "started"

// PreloadFile is the name, in the snapshot's directory (the capture
// container's input directory), of the file whose appearance lets a
// capture container waiting for its signal read the snapshot ahead of the
// capture (preloadCapture): the worker writes it once the snapshot, which
// may be streaming in, is whole and checked.
const PreloadFile = "preload"

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

// JailFailure returns the line (without newline) an in-jail command prints
// on stderr when it fails with err: "jetcrew workspace: capture failed:
// DETAIL" or "jetcrew workspace: unpack failed (KIND): DETAIL".
func JailFailure(a JailArgs, err error) string {
	if a.Command == "capture" {
		return JailErrPrefix + "capture failed: " + oneLine(err.Error())
	}
	return fmt.Sprintf("%sunpack failed (%s): %s", JailErrPrefix, UnpackKind(err), oneLine(err.Error()))
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

// Names of a capture stream's entries.
const (
	captureRecord = "result.json"
	maxRecord     = 4 << 20
)

// WriteCaptureStream writes c as a capture stream: a tar whose first entry
// is "result.json" (c.Result as JSON, without Objects), followed by one
// regular file per result object c holds, named by its kind
// (messages.ResultPatch, ResultBundle, ResultArtifacts), in that order.
func WriteCaptureStream(w io.Writer, c *Captured) error {
	rec := c.Result
	rec.Objects = nil
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	for _, e := range []struct {
		name string
		data []byte
	}{{captureRecord, b}, {messages.ResultPatch, c.Patch}, {messages.ResultBundle, c.Bundle}, {messages.ResultArtifacts, c.Artifacts}, {messages.ResultSession, c.Session}} {
		if e.data == nil {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: tar.TypeReg, Mode: 0o444, Size: int64(len(e.data))}); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// ErrBadCaptureStream is wrapped by ReadCaptureStream's errors for a stream
// that breaks its format or its caps.
var ErrBadCaptureStream = errors.New("not a valid capture stream")

// CaptureObject is one object of a capture stream as ReadCaptureStream
// found it: where its bytes are in the stream (read them with Data, no
// copy held in memory), their length and their SHA-256, computed while the
// stream was read.
type CaptureObject struct {
	// Kind is messages.ResultPatch, ResultBundle or ResultArtifacts.
	Kind string
	// Data reads the object's bytes from the stream's source.
	Data *io.SectionReader
	// Size is its length in bytes.
	Size int64
	// SHA256 is the hex SHA-256 of its bytes.
	SHA256 string
}

// Bytes reads the whole object into memory.
func (o CaptureObject) Bytes() ([]byte, error) {
	b := make([]byte, o.Size)
	_, err := o.Data.ReadAt(b, 0)
	return b, err
}

// CaptureStream is a capture stream read by ReadCaptureStream: its record
// and its objects, in the stream's order.
type CaptureStream struct {
	Result  messages.WorkspaceResult
	Objects []CaptureObject
}

// Object returns the object of kind and whether the stream has one.
func (c *CaptureStream) Object(kind string) (CaptureObject, bool) {
	for _, o := range c.Objects {
		if o.Kind == kind {
			return o, true
		}
	}
	return CaptureObject{}, false
}

// countingReader counts the bytes read through it. It has only Read, so
// archive/tar reads (and never seeks) it: after tar.Reader.Next, n is the
// offset of the entry's data.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// ReadCaptureStream reads a capture stream, the size bytes of src, an
// untrusted source: the record first (at most 4 MiB, decoded with
// messages.DecodeStrictJSON, no Objects), then each object at most once, a
// regular file of at most maxObject bytes (0: no bound) and of a known
// kind, in any order. Only the record is held in memory: each object is
// hashed as it is read and returned as a section of src. Its errors wrap
// ErrBadCaptureStream.
func ReadCaptureStream(src io.ReaderAt, size, maxObject int64) (*CaptureStream, error) {
	cr := &countingReader{r: io.NewSectionReader(src, 0, size)}
	tr := tar.NewReader(cr)
	c := &CaptureStream{}
	seen := map[string]bool{}
	for i := 0; ; i++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			if !seen[captureRecord] {
				return nil, fmt.Errorf("%w: no %s", ErrBadCaptureStream, captureRecord)
			}
			return c, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadCaptureStream, err)
		}
		if err := checkCaptureEntry(hdr, i, seen, maxObject); err != nil {
			return nil, err
		}
		seen[hdr.Name] = true
		if hdr.Name == captureRecord {
			if err := readCaptureRecord(tr, hdr.Size, &c.Result); err != nil {
				return nil, err
			}
			continue
		}
		h := sha256.New()
		off := cr.n
		if n, err := io.Copy(h, tr); err != nil || n != hdr.Size {
			return nil, fmt.Errorf("%w: entry %q: %d of %d bytes: %v", ErrBadCaptureStream, hdr.Name, n, hdr.Size, err)
		}
		c.Objects = append(c.Objects, CaptureObject{Kind: hdr.Name, Data: io.NewSectionReader(src, off, hdr.Size),
			Size: hdr.Size, SHA256: hex.EncodeToString(h.Sum(nil))})
	}
}

// checkCaptureEntry checks the i-th entry of a capture stream (seen holds
// the names before it).
func checkCaptureEntry(hdr *tar.Header, i int, seen map[string]bool, maxObject int64) error {
	limit := maxObject
	if hdr.Name == captureRecord {
		limit = maxRecord
	}
	switch {
	case hdr.Typeflag != tar.TypeReg:
		return fmt.Errorf("%w: entry %q is not a regular file", ErrBadCaptureStream, hdr.Name)
	case seen[hdr.Name]:
		return fmt.Errorf("%w: entry %q twice", ErrBadCaptureStream, hdr.Name)
	case (i == 0) != (hdr.Name == captureRecord):
		return fmt.Errorf("%w: %s must come first, alone", ErrBadCaptureStream, captureRecord)
	case hdr.Size < 0 || limit > 0 && hdr.Size > limit:
		return fmt.Errorf("%w: entry %q is %d bytes, the cap is %d", ErrBadCaptureStream, hdr.Name, hdr.Size, limit)
	}
	switch hdr.Name {
	case captureRecord, messages.ResultPatch, messages.ResultBundle, messages.ResultArtifacts, messages.ResultSession:
		return nil
	}
	return fmt.Errorf("%w: unknown entry %q", ErrBadCaptureStream, hdr.Name)
}

// readCaptureRecord reads the record entry (size bytes from r) into res.
func readCaptureRecord(r io.Reader, size int64, res *messages.WorkspaceResult) error {
	data := make([]byte, size)
	if _, err := io.ReadFull(r, data); err != nil {
		return fmt.Errorf("%w: entry %q: %v", ErrBadCaptureStream, captureRecord, err)
	}
	if err := messages.DecodeStrictJSON(data, res); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadCaptureStream, captureRecord, err)
	}
	if len(res.Objects) > 0 {
		return fmt.Errorf("%w: the record names objects", ErrBadCaptureStream)
	}
	return nil
}

// oneLine returns s on one line (newlines and carriage returns as spaces),
// at most 1 KiB.
func oneLine(s string) string {
	s = strings.NewReplacer("\n", " ", "\r", " ").Replace(s)
	if len(s) > 1024 {
		s = s[:1024]
	}
	return s
}
