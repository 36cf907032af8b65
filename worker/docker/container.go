package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/jetcrew/jetcrew/worker/jail"
)

// drainTimeout is how long Wait lets the attach stream run on after the
// exit before it gives up on the rest of the output. The daemon closes the
// stream as soon as the container's stdio is drained, so this is only a
// safety net against a stuck connection.
const drainTimeout = 30 * time.Second

// errOutputTimeout is the cause Container.Wait reports when the output stream
// did not end within drainTimeout of the exit.
var errOutputTimeout = errors.New("output stream did not end after the container exited")

// Container is a container started by Runtime.Start or taken over by
// Runtime.Adopt. Its methods are safe for concurrent use.
//
// Two goroutines belong to it, both started by Start (or Adopt): one waits
// for the exit (it ends when the daemon reports it, or when Remove or
// Detach cancel the wait) and one copies output (it ends at the output
// stream's EOF, which the daemon sends once the process has exited, or
// when Remove, Detach or Wait close the stream). The output stream is the
// attach stream for a started container and the followed log for an
// adopted one; both carry the same framing.
type Container struct {
	id   string
	name string
	rt   *Runtime

	stream      io.ReadCloser      // the output: attach stream or followed log
	cancel      context.CancelFunc // ends the exit wait (and the log request)
	releaseOnce sync.Once

	waitDone chan struct{} // closed when waitResp/waitErr are set
	waitResp container.WaitResponse
	waitErr  error

	copyDone chan struct{} // closed when copyErr is set
	copyErr  error

	mu     sync.Mutex
	status *jail.ExitStatus // set by the first successful Wait

	// imageID is the engine's id of the container's image.
	imageID string

	// stopped is set by Stop: a SIGKILL after it is Stop's own, so Wait
	// does not wait for an OOM record (see oomSettle).
	stopped atomic.Bool

	// detached is set by Detach: Wait no longer follows the exit.
	detached atomic.Bool
}

// hijacked is an attach connection as an io.ReadCloser.
type hijacked struct{ conn types.HijackedResponse }

func (h hijacked) Read(p []byte) (int, error) { return h.conn.Reader.Read(p) }

func (h hijacked) Close() error {
	h.conn.Close()
	return nil
}

var _ jail.Container = (*Container)(nil)

// ID returns the Docker container id (64 hex digits).
func (c *Container) ID() string { return c.id }

// Name returns the container name, spec.Name.
func (c *Container) Name() string { return c.name }

// waitExit stores the result of the "next-exit" wait registered by Start.
// It always receives from both channels' producer, so the client's goroutine
// never blocks.
func (c *Container) waitExit(respC <-chan container.WaitResponse, errC <-chan error) {
	select {
	case c.waitResp = <-respC:
	case c.waitErr = <-errC:
	}
	close(c.waitDone)
}

// copyOutput demultiplexes the output stream into output until EOF, then
// closes it. endFrame is demux's.
func (c *Container) copyOutput(output jail.OutputFunc, endFrame func(string, int64, byte)) {
	c.copyErr = demux(c.stream, output, endFrame)
	_ = c.stream.Close()
	close(c.copyDone)
}

// release cancels the exit wait and closes the output stream, which ends
// both goroutines. It is idempotent. The cancel comes first: it also
// cancels a followed log's request, which ends a Read of its body that
// Close would otherwise wait for.
func (c *Container) release() {
	c.releaseOnce.Do(func() {
		c.cancel()
		_ = c.stream.Close()
	})
}

// Wait implements jail.Container. It returns once the engine's exit wait
// ("next-exit" for a started container, "not-running" for an adopted one)
// has fired and the output stream has reached EOF (so every byte the
// process wrote has gone to the OutputFunc), reading the result
// with ContainerInspect: Code from State.ExitCode (128+n for signal n; 137
// when killed), OOMKilled from State.OOMKilled and Error from State.Error.
// Should the container have been removed by then, the wait's StatusCode is
// used instead. A process killed by SIGKILL (137) without OOMKilled set,
// and not stopped with Stop, is inspected again for up to oomSettle, as the
// engine may record the OOM kill after the exit.
//
// When ctx ends first Wait returns ctx.Err() and the container keeps
// running; Wait may be called again. After one successful call, later
// calls return the same status at once. When the output stream broke
// instead of ending cleanly, Wait returns the exit status together with an
// error saying the output is incomplete.
func (c *Container) Wait(ctx context.Context) (jail.ExitStatus, error) {
	c.mu.Lock()
	if c.status != nil {
		defer c.mu.Unlock()
		return *c.status, nil
	}
	c.mu.Unlock()

	select {
	case <-c.waitDone:
	case <-ctx.Done():
		return jail.ExitStatus{}, ctx.Err()
	}
	if c.detached.Load() {
		return jail.ExitStatus{}, fmt.Errorf("docker: wait for %s: %w", c.id, jail.ErrDetached)
	}
	if c.waitErr != nil {
		return jail.ExitStatus{}, classify(opWait, c.waitErr)
	}

	drain := time.NewTimer(drainTimeout)
	defer drain.Stop()
	var copyErr error
	select {
	case <-c.copyDone:
		copyErr = c.copyErr
	case <-drain.C:
		c.release()
		<-c.copyDone
		copyErr = errOutputTimeout
	case <-ctx.Done():
		return jail.ExitStatus{}, ctx.Err()
	}
	c.release()

	status, err := c.inspectExit(ctx)
	if err != nil {
		return jail.ExitStatus{}, err
	}
	if copyErr != nil {
		return status, fmt.Errorf("docker: output of container %s is incomplete: %w", c.id, copyErr)
	}
	c.mu.Lock()
	c.status = &status
	c.mu.Unlock()
	return status, nil
}

// oomSettle is how long Wait keeps inspecting a container whose process
// was killed by SIGKILL (exit code 137) for the engine's OOM record. The
// engine learns of an OOM kill from the OOM event and of the exit from the
// exit event; the two come from different sources in containerd's shim and
// are processed in the order they arrive, so under load State.OOMKilled may
// be set a little after the wait has already reported the exit.
const oomSettle = 3 * time.Second

// oomPoll is the pause between those inspections.
const oomPoll = 50 * time.Millisecond

// inspectExit reads how the exited container ended.
func (c *Container) inspectExit(ctx context.Context) (jail.ExitStatus, error) {
	st, found, err := c.inspectOnce(ctx)
	if err != nil || !found || st.OOMKilled {
		return st, err
	}
	// A child killed at the limit while the main process lives on (exit 0,
	// say): the engine's flag may have been overwritten by the exit, and
	// the oom event, which came while the run went on, is what tells.
	if c.rt.oomSeen(c.id) {
		st.OOMKilled = true
		return st, nil
	}
	if st.Code != 137 || c.stopped.Load() {
		return st, nil
	}
	settle := time.NewTimer(oomSettle)
	defer settle.Stop()
	poll := time.NewTicker(oomPoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return st, nil
		case <-settle.C:
			return st, nil
		case <-poll.C:
		}
		if c.rt.oomSeen(c.id) {
			st.OOMKilled = true
			return st, nil
		}
		again, found, err := c.inspectOnce(ctx)
		if err != nil || !found {
			return st, nil // keep what the first inspection said
		}
		if again.OOMKilled {
			return again, nil
		}
	}
}

// inspectOnce reads the exited container's state once (retrying transient
// errors). found is false when the container no longer exists; the status
// then comes from the wait's answer.
func (c *Container) inspectOnce(ctx context.Context) (st jail.ExitStatus, found bool, err error) {
	var info container.InspectResponse
	err = retry(ctx, c.rt.cfg.RetryTimeout, func(ctx context.Context) error {
		var err error
		info, err = c.rt.cli.ContainerInspect(ctx, c.id)
		return err
	})
	switch {
	case cerrdefs.IsNotFound(err):
		st = jail.ExitStatus{Code: int(c.waitResp.StatusCode)}
		if c.waitResp.Error != nil {
			st.Error = c.waitResp.Error.Message
		}
		return st, false, nil
	case err != nil:
		return jail.ExitStatus{}, false, classify(opInspect, err)
	case info.State == nil:
		return jail.ExitStatus{}, false, fmt.Errorf("docker: %s of %s: no state in the answer", opInspect, c.id)
	}
	return jail.ExitStatus{
		Code:      info.State.ExitCode,
		OOMKilled: info.State.OOMKilled,
		Error:     info.State.Error,
	}, true, nil
}

// Stop implements jail.Container with ContainerStop: the engine sends the
// container's StopSignal (SIGTERM, set by Start) to its init process, which
// forwards it to the command, and SIGKILL when grace (rounded up to whole
// seconds; zero or less sends SIGKILL right after SIGTERM, so either may end
// the process) has passed. Stop returns when the
// container has stopped. A container that no longer exists or has already
// exited counts as stopped.
func (c *Container) Stop(ctx context.Context, grace time.Duration) error {
	c.stopped.Store(true)
	secs := max(0, int(math.Ceil(grace.Seconds())))
	err := c.rt.cli.ContainerStop(ctx, c.id, container.StopOptions{Timeout: &secs})
	if err == nil || cerrdefs.IsNotFound(err) {
		return nil
	}
	return classify(opStop, err)
}

// Remove implements jail.Container: it force-removes the container and
// its anonymous volumes (ContainerRemove with Force and RemoveVolumes; gone
// already counts as removed), then closes the output stream and waits,
// within ctx, for the output goroutine to end, so the OutputFunc is not
// called after Remove returns.
func (c *Container) Remove(ctx context.Context) error {
	err := c.rt.remove(ctx, c.id)
	c.release()
	select {
	case <-c.copyDone:
	case <-ctx.Done():
	}
	return err
}

// ImageID returns the engine's id of the container's image ("sha256:…"), for
// the run's receipt.
func (c *Container) ImageID() string { return c.imageID }

// Detach implements jail.Container: it closes the output stream and
// cancels the exit wait, as the end of a worker's process does, and
// returns once the output goroutine has ended (or ctx has), so the
// OutputFunc is not called after it. The container runs on; Wait returns
// an error wrapping jail.ErrDetached from then on, unless it had already
// returned the exit status.
func (c *Container) Detach(ctx context.Context) error {
	c.detached.Store(true)
	c.release()
	select {
	case <-c.copyDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
