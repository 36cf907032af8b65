package docker

import (
	"context"
	"fmt"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/jetcrew/jetcrew/worker/jail"
)

// Adopt implements jail.Runtime. It inspects the container id (a name
// works too; missing: jail.ErrNotFound), refuses one whose log driver is
// "none" (jail.ErrNoOutputLog) or that never started (jail.ErrNotStarted),
// then registers a "not-running" wait, which fires at once for a container
// that has exited, and follows the container's log from its start
// (ContainerLogs with ShowStdout, ShowStderr and Follow: the attach
// stream's framing, demultiplexed the same way, in pieces of at most
// messages.MaxOutputChunk bytes). The engine ends the follow once the
// process has exited; the log is then read once more for what the follow
// may have missed (logs.go: Engine 20.10's follow can end early), so Wait
// returns after the last byte, as for a started container. Should the
// log rotate while followed, so that this second read cannot be lined up
// with the follow, Wait returns the status with an error saying the
// output is incomplete.
//
// The log passes each line once it ends: a line without its newline
// reaches output once 16 KiB of it have gathered (the engine's copier
// splits a longer line into parts, whose bytes come back exactly as
// written) or the stream closes at the exit. Attach passes such bytes at
// once; through the log, a prompt that waits without a newline is not
// seen until then. On Engine 20.10 the newline ending a line longer than
// 16 KiB is lost in the log; it is put back before the stream's next
// bytes, but not after a stream's last line, nor after a line of an exact
// multiple of 16 KiB (newlineRepair).
//
// ctx bounds Adopt only: the wait and the follow are not tied to it. The
// returned Container is a *Container.
func (r *Runtime) Adopt(ctx context.Context, id string, output jail.OutputFunc) (jail.Container, jail.Found, error) {
	var info container.InspectResponse
	err := retry(ctx, r.cfg.RetryTimeout, func(ctx context.Context) error {
		var err error
		info, err = r.cli.ContainerInspect(ctx, id)
		return err
	})
	switch {
	case cerrdefs.IsNotFound(err):
		return nil, jail.Found{}, fmt.Errorf("docker: adopt %s: %w: %w", id, jail.ErrNotFound, classify(opInspect, err))
	case err != nil:
		return nil, jail.Found{}, fmt.Errorf("docker: adopt %s: %w", id, classify(opInspect, err))
	case info.ContainerJSONBase == nil || info.State == nil:
		return nil, jail.Found{}, fmt.Errorf("docker: adopt %s: no state in the inspect answer", id)
	}
	found := foundOf(info)
	switch {
	case info.HostConfig == nil || info.HostConfig.LogConfig.Type == "none":
		return nil, found, fmt.Errorf("docker: adopt %s: %w (log driver none): %w", found.Name, jail.ErrNoOutputLog, jail.ErrPermanent)
	case !found.Running && found.StartedAt.IsZero():
		return nil, found, fmt.Errorf("docker: adopt %s: %w (state %s): %w", found.Name, jail.ErrNotStarted, info.State.Status, jail.ErrPermanent)
	}
	if output == nil {
		output = func(string, []byte) {}
	}
	c, err := r.follow(ctx, found.ID, found.Name, output, found.Running)
	if err != nil {
		return nil, found, fmt.Errorf("docker: adopt %s: %w", found.Name, err)
	}
	c.imageID = found.ImageID
	r.log.Debug().Str("container", found.ID).Str("name", found.Name).Bool("running", found.Running).Msg("container adopted")
	return c, found, nil
}

// follow registers a "not-running" wait for container id and follows its
// log from the start (copyLog), returning the Container whose two
// goroutines carry them. running says whether the container ran when
// inspected.
func (r *Runtime) follow(ctx context.Context, id, name string, output jail.OutputFunc, running bool) (*Container, error) {
	// The wait and the log outlive Adopt's ctx: they end when the
	// container has exited, or when release cancels them.
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	respC, errC := r.cli.ContainerWait(bg, id, container.WaitConditionNotRunning)
	select {
	case err := <-errC: // the wait request itself failed
		cancel()
		return nil, classify(opWait, err)
	default:
	}
	logs, err := r.cli.ContainerLogs(bg, id, container.LogsOptions{ShowStdout: true, ShowStderr: true, Follow: true})
	if err != nil {
		cancel()
		// The wait's goroutine ends with an error now, or has a result
		// to hand over: take it, so it never blocks.
		go func() {
			select {
			case <-respC:
			case <-errC:
			}
		}()
		return nil, classify(opLogs, err)
	}
	c := &Container{
		id:       id,
		name:     name,
		rt:       r,
		stream:   logs,
		cancel:   cancel,
		waitDone: make(chan struct{}),
		copyDone: make(chan struct{}),
	}
	go c.waitExit(respC, errC)
	go c.copyLog(bg, output, running)
	return c, nil
}

// foundOf reads what Adopt reports of a container from its inspection.
func foundOf(info container.InspectResponse) jail.Found {
	f := jail.Found{
		ID:      info.ID,
		Name:    trimSlash(info.Name),
		ImageID: info.Image,
		Running: info.State.Running,
	}
	if info.Config != nil {
		f.Labels = info.Config.Labels
	}
	// Docker answers "0001-01-01T00:00:00Z" for a container never
	// started: the zero time.
	if t, err := time.Parse(time.RFC3339Nano, info.State.StartedAt); err == nil {
		f.StartedAt = t
	}
	if !f.Running {
		f.Status = jail.ExitStatus{Code: info.State.ExitCode, OOMKilled: info.State.OOMKilled, Error: info.State.Error}
	}
	for _, m := range info.Mounts {
		switch m.Type {
		case mount.TypeBind:
			f.Mounts = append(f.Mounts, jail.Mount{Source: m.Source, Target: m.Destination, ReadOnly: !m.RW})
		case mount.TypeVolume:
			f.Mounts = append(f.Mounts, jail.Mount{Source: m.Name, Volume: true, Target: m.Destination, ReadOnly: !m.RW})
		}
	}
	return f
}
