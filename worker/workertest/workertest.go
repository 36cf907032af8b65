// Package workertest holds test helpers for code built on the worker
// package: an embedded nats-server per test and a fake Runtime that runs Go
// functions instead of containers. They are real code, usable from any test.
package workertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
)

// StartServer starts an embedded nats-server with JetStream on a random
// loopback port for the test: coordtest.StartServer, the one embedded-server
// helper of the project's tests.
func StartServer(t testing.TB) *server.Server { return coordtest.StartServer(t) }

// Connect connects to s and closes the connection when the test ends:
// coordtest.Connect.
func Connect(t testing.TB, s *server.Server) *nats.Conn { return coordtest.Connect(t, s) }

// Behaviour is what a fake container does: it receives the spec, writes
// output through out, and returns its exit status. ctx is cancelled when
// the container is stopped; a stopped behaviour should return exit code 143.
type Behaviour func(ctx context.Context, spec jail.ContainerSpec, out jail.OutputFunc) jail.ExitStatus

// Runtime is a fake jail.Runtime. Its Behave function chooses the
// Behaviour for each spec; by default the prompt (the last argv element) is
// read as a tiny script (see Script). The in-jail workspace commands run in
// process (jail.go): a workspace run's container unpacks its snapshot, then
// behaves as Behave says for the spec without the `jetcrew workspace exec`
// prefix; a capture container captures.
type Runtime struct {
	// Behave returns the behaviour of a container, or an error to make
	// Start fail with it. Nil means ScriptBehaviour.
	Behave func(spec jail.ContainerSpec) (Behaviour, error)
	// RemoveErr, when set, is asked before each Remove: an error it returns
	// makes that Remove fail, leaving the container in place.
	RemoveErr func(id string) error
	// Images, when set, names the engine's image id of an image
	// reference: a container records the id at its start (ImageID) and
	// the runtime answers it (ImageID, as the Docker runtime's). Nil: no
	// image has an id.
	Images func(ref string) string
	// StartErr, when set, is asked before each Start, capture containers'
	// included: an error it returns makes that Start fail with it.
	StartErr func(spec jail.ContainerSpec) error

	mu         sync.Mutex
	seq        int
	containers map[string]*proc
	volumes    map[string]fakeVolume
	volumeBase string
	closed     bool // Close was called: no volume is made any more
	starts     []jail.ContainerSpec
	handoffs   []jail.ContainerSpec
	paused     map[string]chan struct{} // by container name: closed by Unpause
	running    int
	maxRunning int
}

// NewRuntime returns a Runtime with no containers. Its volumes are
// directories under a temporary directory of its own, made on the first
// CreateVolume and removed with its last volume, or by Close.
func NewRuntime() *Runtime {
	return &Runtime{containers: map[string]*proc{}, volumes: map[string]fakeVolume{}}
}

// NewTestRuntime is NewRuntime for test t: whatever volumes are left when
// the test ends are removed then (Close), so a test leaves nothing in
// $TMPDIR.
func NewTestRuntime(t testing.TB) *Runtime {
	r := NewRuntime()
	t.Cleanup(r.Close)
	return r
}

// Close removes every volume's directory, whatever containers still mount
// them; a later CreateVolume fails.
func (r *Runtime) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	if r.volumeBase != "" {
		_ = os.RemoveAll(r.volumeBase)
		r.volumeBase = ""
	}
	clear(r.volumes)
}

// Start implements jail.Runtime. A name already in use is refused, as
// Docker does. Behave and the behaviour see the spec with each volume mount
// turned into a bind mount of the volume's directory (Starts keeps the
// spec as given).
//
// As the engine's, the container belongs to the Runtime, not to ctx nor
// to the Container returned: it runs on when ctx ends, when a Wait's ctx
// ends and after Detach, until it exits, is stopped or removed; another
// Container of it can be had with Adopt. out is called in the behaviour's
// goroutine, as it writes, until Detach; the output is also kept for
// Adopt (spec.OutputLogBytes; see outputLog).
func (r *Runtime) Start(ctx context.Context, given jail.ContainerSpec, out jail.OutputFunc) (jail.Container, error) {
	if r.StartErr != nil {
		if err := r.StartErr(given); err != nil {
			return nil, err
		}
	}
	behave := r.Behave
	if behave == nil {
		behave = ScriptBehaviour
	}
	spec := r.resolveVolumes(given)
	var b Behaviour
	signals := make(chan string, 1)
	ja, jailed := jailArgs(spec)
	switch {
	case warmLauncher(spec):
		var err error
		if b, err = r.warmBehaviour(spec, behave); err != nil {
			return nil, err
		}
	case jailed && ja.Command == "capture":
		// A capture container: the workspace command alone, whatever
		// Behave says, after the signal when it waits for one.
		b = jailBehaviour(ja, nil)
		if ja.Wait {
			b = waitForSignal(signals, b)
		}
	case jailed:
		inner := spec
		inner.Cmd = ja.Argv
		ib, err := behave(inner)
		if err != nil {
			return nil, err
		}
		b = jailBehaviour(ja, ib)
	default:
		var err error
		if b, err = behave(spec); err != nil {
			return nil, err
		}
	}
	r.mu.Lock()
	for _, c := range r.containers {
		if c.name == spec.Name {
			r.mu.Unlock()
			return nil, fmt.Errorf("conflict: container name %q is already in use", spec.Name)
		}
	}
	r.seq++
	id := fmt.Sprintf("fake%060d", r.seq)
	cctx, cancel := context.WithCancel(context.Background())
	if out == nil {
		out = func(string, []byte) {}
	}
	p := &proc{id: id, name: spec.Name, spec: given, cancel: cancel, done: make(chan struct{}), created: time.Now(), rt: r,
		signals: signals, log: newOutputLog(given.OutputLogBytes, out)}
	if r.Images != nil {
		p.imageID = r.Images(spec.Image)
	}
	r.containers[id] = p
	r.starts = append(r.starts, given)
	r.running++
	r.maxRunning = max(r.maxRunning, r.running)
	r.mu.Unlock()
	go func() {
		st := b(cctx, spec, p.log.write)
		r.mu.Lock()
		r.running--
		p.status = st
		p.exited = true
		r.mu.Unlock()
		p.log.close()
		close(p.done)
	}()
	return &Container{proc: p}, nil
}

// ListManaged implements jail.Runtime.
func (r *Runtime) ListManaged(ctx context.Context) ([]jail.ManagedContainer, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []jail.ManagedContainer
	for _, c := range r.containers {
		state := "running"
		if c.exited {
			state = "exited"
		}
		var binds []string
		for _, m := range c.spec.Mounts {
			if !m.Volume {
				binds = append(binds, m.Source)
			}
		}
		out = append(out, jail.ManagedContainer{ID: c.id, Name: c.name, State: state, Labels: c.spec.Labels, Created: c.created, Binds: binds})
	}
	return out, nil
}

// removeWait bounds how long Remove waits for a removed container's
// behaviour to end.
const removeWait = 10 * time.Second

// Remove implements jail.Runtime. As `docker rm -f` returns once the
// container's processes are gone, it cancels the container's behaviour and
// waits for it to return (until ctx ends, at most removeWait): whatever
// the behaviour held (a warm launcher's hand-off connection) is closed
// when Remove returns.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	if r.RemoveErr != nil {
		if err := r.RemoveErr(id); err != nil {
			return err
		}
	}
	r.mu.Lock()
	p, ok := r.containers[id]
	delete(r.containers, id)
	r.mu.Unlock()
	if !ok {
		return nil
	}
	p.cancel()
	t := time.NewTimer(removeWait)
	defer t.Stop()
	select {
	case <-p.done:
	case <-ctx.Done():
	case <-t.C:
	}
	return nil
}

// Starts returns the specs of every container started, in order.
func (r *Runtime) Starts() []jail.ContainerSpec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]jail.ContainerSpec(nil), r.starts...)
}

// MaxRunning returns the most containers that ran at once.
func (r *Runtime) MaxRunning() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxRunning
}

// Live returns the number of containers not yet removed.
func (r *Runtime) Live() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.containers)
}

// proc is a fake container: its behaviour's goroutine is its process. It
// lives in its Runtime, whichever Container handles it, until removed.
type proc struct {
	id, name string
	spec     jail.ContainerSpec
	cancel   context.CancelFunc
	done     chan struct{}
	created  time.Time
	rt       *Runtime
	status   jail.ExitStatus
	exited   bool
	signals  chan string
	imageID  string
	log      *outputLog
}

// Container is a fake container as Start or Adopt returns it: a handle
// on the container (proc) with its own way to the output, Start's
// OutputFunc called as the behaviour writes or Adopt's follower of the
// output log.
type Container struct {
	*proc
	// follower is Adopt's reading of the output log; nil for Start's.
	follower *follower
	// detached is set by Detach; waited once Wait returned the status,
	// which it then still returns after a Detach.
	detached, waited atomic.Bool
}

// ID implements jail.Container.
func (c *Container) ID() string { return c.id }

// ImageID implements jail.Container: the id Runtime.Images named for the
// container's image at its start, else "".
func (c *Container) ImageID() string { return c.imageID }

// ImageID returns the image id Images names for ref now ("" without
// Images), as the Docker runtime's ImageID does (worker/warm.ImageLister).
func (r *Runtime) ImageID(_ context.Context, ref string) (string, error) {
	if r.Images == nil {
		return "", nil
	}
	return r.Images(ref), nil
}

// Wait implements jail.Container: it returns once the behaviour has
// returned and, for an adopted container, its follower has passed the
// whole output log; after Detach, an error wrapping jail.ErrDetached.
// When ctx ends first the container runs on.
func (c *Container) Wait(ctx context.Context) (jail.ExitStatus, error) {
	if c.detached.Load() && !c.waited.Load() {
		return jail.ExitStatus{}, fmt.Errorf("wait for %s: %w", c.id, jail.ErrDetached)
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return jail.ExitStatus{}, ctx.Err()
	}
	if c.follower != nil {
		select {
		case <-c.follower.done:
		case <-ctx.Done():
			return jail.ExitStatus{}, ctx.Err()
		}
	}
	if c.detached.Load() && !c.waited.Load() {
		return jail.ExitStatus{}, fmt.Errorf("wait for %s: %w", c.id, jail.ErrDetached)
	}
	c.waited.Store(true)
	c.rt.mu.Lock()
	defer c.rt.mu.Unlock()
	return c.status, nil
}

// Stop implements jail.Container: it cancels the behaviour's context.
func (c *Container) Stop(ctx context.Context, grace time.Duration) error {
	c.cancel()
	return nil
}

// Remove implements jail.Container: Runtime.Remove, then, for an adopted
// container, the end of its follower (within ctx), so its OutputFunc is
// not called after Remove returns.
func (c *Container) Remove(ctx context.Context) error {
	err := c.rt.Remove(ctx, c.id)
	if c.follower != nil {
		_ = c.follower.stop(ctx)
	}
	return err
}

// Signal implements jail.Container: a behaviour waiting for a signal (a
// capture container started with --wait) goes on; a container that has
// exited is an error, as the engine's.
func (c *Container) Signal(ctx context.Context, sig string) error {
	select {
	case <-c.done:
		return fmt.Errorf("container %s is not running", c.id)
	default:
	}
	select {
	case c.signals <- sig:
	default:
	}
	return nil
}

// ScriptBehaviour reads the last argv element as a script of
// semicolon-separated commands: "out TEXT" writes TEXT to stdout, "err TEXT"
// to stderr, "sleep DURATION" waits (returning 143 when stopped), "exit N"
// ends with code N, "oom" ends as the kernel's OOM killer would (137,
// OOMKilled). The script "" exits 0.
func ScriptBehaviour(spec jail.ContainerSpec) (Behaviour, error) {
	script := ""
	if len(spec.Cmd) > 0 {
		script = spec.Cmd[len(spec.Cmd)-1]
	}
	return func(ctx context.Context, _ jail.ContainerSpec, out jail.OutputFunc) jail.ExitStatus {
		for _, stmt := range strings.Split(script, ";") {
			verb, arg, _ := strings.Cut(strings.TrimSpace(stmt), " ")
			switch verb {
			case "out":
				out("stdout", []byte(arg+"\n"))
			case "err":
				out("stderr", []byte(arg+"\n"))
			case "sleep":
				d, _ := time.ParseDuration(arg)
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return jail.ExitStatus{Code: 143}
				}
			case "exit":
				var code int
				fmt.Sscanf(arg, "%d", &code)
				return jail.ExitStatus{Code: code}
			case "oom":
				return jail.ExitStatus{Code: 137, OOMKilled: true}
			}
		}
		return jail.ExitStatus{}
	}, nil
}

// ErrTransient is a Start error that is not permanent: the worker retries.
var ErrTransient = errors.New("fake daemon error")

// Logger returns a logger for code under test: silent, unless the
// environment variable JETCREW_TEST_LOG names a file, where JSON lines are
// appended.
func Logger(t testing.TB) zerolog.Logger {
	path := os.Getenv("JETCREW_TEST_LOG")
	if path == "" {
		return zerolog.Nop()
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatalf("test log: %v", err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return zerolog.New(f).With().Timestamp().Str("test", t.Name()).Logger()
}

// BridgeFile writes a stand-in for the jetcrew-bridge binary (a regular
// file, mode 0555) under t.TempDir() and returns its path, for worker tests
// whose fake runtime never executes it.
func BridgeFile(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "jetcrew-bridge")
	if err := os.WriteFile(path, []byte("#!/bin/false\n"), 0o555); err != nil {
		t.Fatalf("bridge file: %v", err)
	}
	return path
}

// StateDir returns a short directory for a worker's per-run directories
// (unix socket paths are limited to 107 bytes), removed when the test ends.
func StateDir(t testing.TB) string { return coordtest.SocketDir(t) }

// Events returns every event of run runID on JETCREW_EVENTS, in stream
// order, read with an ordered consumer filtered on
// jetcrew.events.<run_id>.>. It fails the test when the stream cannot be
// read.
func Events(t testing.TB, js jetstream.JetStream, runID string) []jetstream.Msg {
	t.Helper()
	c, err := js.OrderedConsumer(context.Background(), messages.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{messages.SubjectEventsAll(runID)},
	})
	if err != nil {
		t.Fatalf("events of %s: %v", runID, err)
	}
	var out []jetstream.Msg
	for {
		batch, err := c.FetchNoWait(500)
		if err != nil {
			t.Fatalf("events of %s: %v", runID, err)
		}
		n := 0
		for m := range batch.Messages() {
			out = append(out, m)
			n++
		}
		if n == 0 {
			return out
		}
	}
}
