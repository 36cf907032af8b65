package workspace

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
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
		return captureMain(a, stdout, stderr)
	}
	return execMain(a, stderr)
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

// JailFailure returns the line (without newline) an in-jail command prints
// on stderr when it fails with err: "jetcrew workspace: capture failed:
// DETAIL" or "jetcrew workspace: unpack failed (KIND): DETAIL".
func JailFailure(a JailArgs, err error) string {
	if a.Command == "capture" {
		return JailErrPrefix + "capture failed: " + oneLine(err.Error())
	}
	return fmt.Sprintf("%sunpack failed (%s): %s", JailErrPrefix, UnpackKind(err), oneLine(err.Error()))
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
