package workertest

import (
	"context"
	"os"
	"path"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/workspace"
)

// jailArgs returns the in-jail workspace command a spec runs (its argv
// runs a binary named jetcrew, the staged tool, with "workspace"), its
// paths turned into
// the host paths of the spec's mounts (resolveVolumes made volume mounts
// bind mounts), and whether it runs one.
func jailArgs(spec jail.ContainerSpec) (workspace.JailArgs, bool) {
	if len(spec.Cmd) < 2 || path.Base(spec.Cmd[0]) != "jetcrew" || spec.Cmd[1] != "workspace" {
		return workspace.JailArgs{}, false
	}
	a, err := workspace.ParseJailArgs(spec.Cmd[2:])
	if err != nil {
		return workspace.JailArgs{Command: "invalid: " + err.Error()}, true
	}
	a.Snapshot, a.Dir, a.Scratch = hostPath(spec, a.Snapshot), hostPath(spec, a.Dir), hostPath(spec, a.Scratch)
	if a.Held != "" {
		a.Held = hostPath(spec, a.Held)
	}
	if a.RunIDFile != "" {
		a.RunIDFile = hostPath(spec, a.RunIDFile)
	}
	return a, true
}

// hostPath returns the host path of container path p through spec's
// mounts; p itself when no mount holds it.
func hostPath(spec jail.ContainerSpec, p string) string {
	for _, m := range spec.Mounts {
		if p == m.Target {
			return m.Source
		}
		if rest, ok := strings.CutPrefix(p, m.Target+"/"); ok {
			return m.Source + "/" + rest
		}
	}
	return p
}

// waitForSignal makes b wait, before it runs, for a signal (Signal) on
// signals, as `jetcrew workspace capture --wait` does; a stop first ends
// it with exit code 143.
func waitForSignal(signals <-chan string, b Behaviour) Behaviour {
	return func(ctx context.Context, spec jail.ContainerSpec, out jail.OutputFunc) jail.ExitStatus {
		out(messages.StreamStderr, []byte(workspace.CaptureReadyLine+"\n"))
		select {
		case <-signals:
		case <-ctx.Done():
			return jail.ExitStatus{Code: 143}
		}
		return b(ctx, spec, out)
	}
}

// jailBehaviour runs the in-jail workspace commands in process, as the
// Docker runtime's containers run the staged binary: exec unpacks (as the
// test's user, no chown), after waiting for the held file when it has
// one, and then behaves as inner on the spec whose Cmd is
// the original argv; capture writes its stream on stdout. A failure prints
// workspace.JailFailure's line on stderr and exits workspace.JailExitCode.
func jailBehaviour(a workspace.JailArgs, inner Behaviour) Behaviour {
	return func(ctx context.Context, spec jail.ContainerSpec, out jail.OutputFunc) jail.ExitStatus {
		fail := func(err error) jail.ExitStatus {
			out(messages.StreamStderr, []byte(workspace.JailFailure(a, err)+"\n"))
			return jail.ExitStatus{Code: workspace.JailExitCode}
		}
		switch a.Command {
		case "capture":
			if err := a.ResolveRunID(); err != nil {
				return fail(err)
			}
			workspace.ReportFull(a.Dir, streamWriter{out, messages.StreamStderr})
			if err := workspace.JailCapture(a, streamWriter{out, messages.StreamStdout}); err != nil {
				return fail(err)
			}
			return jail.ExitStatus{}
		case "exec":
			if a.Held != "" && !waitFile(ctx, a.Held) {
				return jail.ExitStatus{Code: 143} // stopped while waiting
			}
			if err := workspace.JailUnpack(a); err != nil {
				return fail(err)
			}
			workspace.NotifyStarted(a)
			spec.Cmd = a.Argv
			return inner(ctx, spec, out)
		}
		out(messages.StreamStderr, []byte(a.Command+"\n"))
		return jail.ExitStatus{Code: 2}
	}
}

// waitFile reports whether path exists, looking every millisecond until it
// does (true) or ctx ends (false): exec's wait for the held file.
func waitFile(ctx context.Context, path string) bool {
	for {
		if _, err := os.Stat(path); err == nil {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Millisecond):
		}
	}
}

// streamWriter writes to one of a container's output streams.
type streamWriter struct {
	out    jail.OutputFunc
	stream string
}

func (w streamWriter) Write(p []byte) (int, error) {
	w.out(w.stream, p)
	return len(p), nil
}
