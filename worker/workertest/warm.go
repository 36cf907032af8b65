package workertest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
)

// warmLauncher reports whether spec is a warm container's (worker/warm):
// its command is the jetcrew launcher waiting on its hand-off socket.
func warmLauncher(spec jail.ContainerSpec) bool {
	return len(spec.Cmd) == 4 && spec.Cmd[0] == messages.ContainerBridgePath && spec.Cmd[1] == "launch" &&
		spec.Cmd[2] == "--handoff" && spec.Cmd[3] == messages.ContainerHandoffPath
}

// warmBehaviour is what the fake does for a warm container, as the real
// launcher does (coordination/bridgecmd): it connects to the hand-off
// socket in the container's run directory, waits for the run, answers
// messages.HandoffAck and then behaves as behave says for a spec with the
// run's command, environment and working directory, and its run directory
// where the worker has moved it since (a real mount follows the directory;
// the fake follows an open descriptor of it). A workspace run's in-jail
// exec runs in process, as in a cold container. The spec handed off is
// recorded (Runtime.Handoffs).
func (r *Runtime) warmBehaviour(spec jail.ContainerSpec, behave func(jail.ContainerSpec) (Behaviour, error)) (Behaviour, error) {
	i := slices.IndexFunc(spec.Mounts, func(m jail.Mount) bool { return m.Target == messages.ContainerRunDir })
	if i < 0 {
		return nil, fmt.Errorf("warm container without a run directory: %w", jail.ErrPermanent)
	}
	dir, err := os.Open(spec.Mounts[i].Source)
	if err != nil {
		return nil, fmt.Errorf("warm container's run directory: %w", err)
	}
	conn, err := net.Dial("unix", filepath.Join(spec.Mounts[i].Source, messages.HandoffName))
	if err != nil {
		_ = dir.Close()
		return nil, fmt.Errorf("warm container's hand-off socket: %w", err)
	}
	return func(ctx context.Context, _ jail.ContainerSpec, out jail.OutputFunc) jail.ExitStatus {
		defer dir.Close()
		stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
		line, err := r.readHandoff(ctx, spec.Name, conn)
		stop()
		if err != nil {
			_ = conn.Close()
			if ctx.Err() != nil {
				return jail.ExitStatus{Code: 143}
			}
			if err == io.EOF && len(line) == 0 {
				return jail.ExitStatus{}
			}
			return jail.ExitStatus{Code: 1}
		}
		var h messages.Handoff
		if err := json.Unmarshal(line, &h); err != nil || len(h.Argv) == 0 {
			_ = conn.Close()
			return jail.ExitStatus{Code: 1}
		}
		_, _ = io.WriteString(conn, messages.HandoffAck)
		_ = conn.Close()
		run := spec
		run.Cmd, run.WorkingDir = h.Argv, cmpOr(h.Dir, spec.WorkingDir)
		run.Env = overlay(spec.Env, h.Env)
		run.Mounts = slices.Clone(spec.Mounts)
		if now, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", dir.Fd())); err == nil {
			run.Mounts[i].Source = now
		}
		r.mu.Lock()
		r.handoffs = append(r.handoffs, run)
		r.mu.Unlock()
		// A workspace run's command is `jetcrew workspace exec`: it unpacks
		// in process, then behaves as behave says, as a cold one does.
		inner := run
		ja, jailed := jailArgs(run)
		if jailed {
			inner.Cmd = ja.Argv
		}
		b, err := behave(inner)
		if err == nil && jailed {
			b = jailBehaviour(ja, b)
		}
		if err != nil {
			out("stderr", []byte(err.Error()+"\n"))
			return jail.ExitStatus{Code: 127}
		}
		return b(ctx, run, out)
	}, nil
}

// readHandoff returns the first line the worker writes on conn that is
// not a probe, answering each probe (messages.HandoffProbe) as the real
// launcher does, unless container name is paused (Pause): a paused
// container reads nothing until it is resumed (Unpause) or stopped.
func (r *Runtime) readHandoff(ctx context.Context, name string, conn net.Conn) ([]byte, error) {
	rd := bufio.NewReader(conn)
	for {
		line, err := rd.ReadBytes('\n')
		if err == nil {
			err = r.awaitUnpaused(ctx, name)
		}
		if err != nil || string(line) != messages.HandoffProbe {
			return line, err
		}
		if _, err := io.WriteString(conn, messages.HandoffAlive); err != nil {
			return nil, err
		}
	}
}

// Pause pauses container id, as `docker pause` does: the warm launcher in
// it answers neither a probe nor a hand-off until Unpause.
func (r *Runtime) Pause(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.containers[id]; ok && r.paused[c.name] == nil {
		if r.paused == nil {
			r.paused = map[string]chan struct{}{}
		}
		r.paused[c.name] = make(chan struct{})
	}
}

// Unpause resumes container id, paused by Pause.
func (r *Runtime) Unpause(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.containers[id]; ok && r.paused[c.name] != nil {
		close(r.paused[c.name])
		delete(r.paused, c.name)
	}
}

// awaitUnpaused returns once container name is not paused, or ctx's error
// when it is stopped first.
func (r *Runtime) awaitUnpaused(ctx context.Context, name string) error {
	r.mu.Lock()
	ch := r.paused[name]
	r.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Handoffs returns the specs warm containers were handed, in order: each
// warm container's spec with the run's command, environment, working
// directory and run directory.
func (r *Runtime) Handoffs() []jail.ContainerSpec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.handoffs)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// overlay returns env with each KEY=VALUE of set over it, as the launcher
// sets a hand-off's environment.
func overlay(env, set []string) []string {
	env = slices.Clone(env)
	for _, kv := range set {
		k, _, _ := strings.Cut(kv, "=")
		env = slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, k+"=") })
		env = append(env, kv)
	}
	return env
}
