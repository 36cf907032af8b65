package docker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/stretchr/testify/require"
)

// connectionFailed returns the error the Docker client gives when the
// daemon's socket does not answer.
func connectionFailed(t *testing.T) error {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.WithHost("unix:///nonexistent/docker.sock"), client.WithVersion("1.41"))
	require.NoError(t, err)
	defer cli.Close()
	_, err = cli.ContainerList(context.Background(), container.ListOptions{})
	require.True(t, client.IsErrConnectionFailed(err), "%v", err)
	return err
}

func TestClassify(t *testing.T) {
	t.Parallel()

	daemon := func(kind error, msg string) error {
		return fmt.Errorf("Error response from daemon: %s: %w", msg, kind)
	}
	tests := []struct {
		name      string
		op        string
		err       error
		permanent bool
		nameInUse bool
	}{
		{"bad request", opCreate, daemon(cerrdefs.ErrInvalidArgument, "invalid mount config"), true, false},
		{"not found", opInspect, daemon(cerrdefs.ErrNotFound, "No such container"), true, false},
		{"forbidden", opCreate, daemon(cerrdefs.ErrPermissionDenied, "authorization denied"), true, false},
		{"not implemented", opCreate, daemon(cerrdefs.ErrNotImplemented, "nope"), true, false},
		{"name conflict", opCreate, daemon(cerrdefs.ErrConflict, "Conflict. The container name is already in use"), false, true},
		{"conflict elsewhere", opRemove, daemon(cerrdefs.ErrConflict, "removal already in progress"), false, false},
		{"internal", opStart, daemon(cerrdefs.ErrInternal, "OCI runtime create failed"), false, false},
		{"unavailable", opList, daemon(cerrdefs.ErrUnavailable, "shutting down"), false, false},
		{"deadline", opInspect, context.DeadlineExceeded, false, false},
		{"canceled", opInspect, context.Canceled, false, false},
		{"connection failed", opList, connectionFailed(t), false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := classify(tt.op, tt.err)
			require.ErrorIs(t, err, tt.err)
			require.ErrorContains(t, err, "docker "+tt.op+": ")
			require.Equal(t, tt.permanent, errors.Is(err, jail.ErrPermanent), "permanent: %v", err)
			require.Equal(t, tt.nameInUse, errors.Is(err, ErrNameInUse), "name in use: %v", err)
		})
	}
	require.NoError(t, classify(opStart, nil))
}

func TestTransient(t *testing.T) {
	t.Parallel()

	require.True(t, transient(connectionFailed(t)))
	require.True(t, transient(fmt.Errorf("x: %w", cerrdefs.ErrUnavailable)))
	require.True(t, transient(fmt.Errorf("x: %w", cerrdefs.ErrInternal)))
	require.True(t, transient(context.DeadlineExceeded))
	require.False(t, transient(context.Canceled))
	require.False(t, transient(fmt.Errorf("x: %w", cerrdefs.ErrNotFound)))
	require.False(t, transient(fmt.Errorf("x: %w", cerrdefs.ErrInvalidArgument)))
	require.False(t, transient(nil))
}

func TestRetry(t *testing.T) {
	t.Parallel()

	t.Run("transient then success", func(t *testing.T) {
		t.Parallel()
		calls := 0
		err := retry(context.Background(), 10*time.Second, func(context.Context) error {
			calls++
			if calls < 3 {
				return cerrdefs.ErrUnavailable
			}
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, 3, calls)
	})
	t.Run("not transient", func(t *testing.T) {
		t.Parallel()
		calls := 0
		err := retry(context.Background(), 10*time.Second, func(context.Context) error {
			calls++
			return cerrdefs.ErrNotFound
		})
		require.ErrorIs(t, err, cerrdefs.ErrNotFound)
		require.Equal(t, 1, calls)
	})
	t.Run("gives up", func(t *testing.T) {
		t.Parallel()
		began := time.Now()
		err := retry(context.Background(), 300*time.Millisecond, func(context.Context) error {
			return cerrdefs.ErrUnavailable
		})
		require.ErrorIs(t, err, cerrdefs.ErrUnavailable)
		require.Less(t, time.Since(began), 5*time.Second)
	})
	t.Run("context ends", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		err := retry(ctx, time.Minute, func(context.Context) error {
			return cerrdefs.ErrUnavailable
		})
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})
}

// fakeClient overrides some apiClient methods; the others panic.
type fakeClient struct {
	apiClient
	imageInspect    func(ref string) (image.InspectResponse, error)
	containerRemove func(id string) error
}

func (f *fakeClient) ImageInspect(_ context.Context, ref string, _ ...client.ImageInspectOption) (image.InspectResponse, error) {
	return f.imageInspect(ref)
}

func (f *fakeClient) ContainerRemove(_ context.Context, id string, opts container.RemoveOptions) error {
	if !opts.Force || !opts.RemoveVolumes {
		panic("remove without Force and RemoveVolumes")
	}
	return f.containerRemove(id)
}

func TestRemoveCountsGoneAsRemoved(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		err     error
		wantErr bool
	}{
		{"removed", nil, false},
		{"not found", fmt.Errorf("Error response from daemon: No such container: x: %w", cerrdefs.ErrNotFound), false},
		{"in progress", fmt.Errorf("Error response from daemon: removal of container x is already in progress: %w", cerrdefs.ErrConflict), false},
		{"other conflict", fmt.Errorf("Error response from daemon: something: %w", cerrdefs.ErrConflict), true},
		{"forbidden", fmt.Errorf("denied: %w", cerrdefs.ErrPermissionDenied), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rt := newRuntime(&fakeClient{containerRemove: func(string) error { return tt.err }}, Config{RetryTimeout: -1}.withDefaults())
			err := rt.Remove(context.Background(), "x")
			if tt.wantErr {
				require.ErrorIs(t, err, tt.err)
			} else {
				require.NoError(t, err)
			}
		})
	}
}

func TestStartImageErrors(t *testing.T) {
	t.Parallel()

	t.Run("missing image is permanent", func(t *testing.T) {
		t.Parallel()
		rt := newRuntime(&fakeClient{imageInspect: func(string) (image.InspectResponse, error) {
			return image.InspectResponse{}, fmt.Errorf("No such image: %w", cerrdefs.ErrNotFound)
		}}, Config{}.withDefaults())
		_, err := rt.Start(context.Background(), validSpecWithoutMounts(), nil)
		require.ErrorIs(t, err, jail.ErrPermanent)
		require.ErrorIs(t, err, jail.ErrImageNotFound, "the worker's runtime proof falls back to another image on it")
		require.EqualError(t, err, `docker: image "jetcrew-sandbox:latest" not found on this Docker engine; build it (make images) or fix the profile: permanent runtime error`)
	})
	t.Run("an unreachable daemon is no missing image", func(t *testing.T) {
		t.Parallel()
		rt := newRuntime(&fakeClient{imageInspect: func(string) (image.InspectResponse, error) {
			return image.InspectResponse{}, fmt.Errorf("restarting: %w", cerrdefs.ErrUnavailable)
		}}, Config{RetryTimeout: 100 * time.Millisecond}.withDefaults())
		_, err := rt.Start(context.Background(), validSpecWithoutMounts(), nil)
		require.NotErrorIs(t, err, jail.ErrImageNotFound)
	})
	t.Run("unreachable daemon is transient", func(t *testing.T) {
		t.Parallel()
		calls := 0
		rt := newRuntime(&fakeClient{imageInspect: func(string) (image.InspectResponse, error) {
			calls++
			return image.InspectResponse{}, fmt.Errorf("restarting: %w", cerrdefs.ErrUnavailable)
		}}, Config{RetryTimeout: 300 * time.Millisecond}.withDefaults())
		_, err := rt.Start(context.Background(), validSpecWithoutMounts(), nil)
		require.Error(t, err)
		require.NotErrorIs(t, err, jail.ErrPermanent)
		require.Greater(t, calls, 1, "retried")
	})
	t.Run("refused spec makes no call", func(t *testing.T) {
		t.Parallel()
		rt := newRuntime(&fakeClient{}, Config{}.withDefaults())
		spec := validSpecWithoutMounts()
		spec.User = "0:0"
		_, err := rt.Start(context.Background(), spec, nil)
		require.ErrorIs(t, err, jail.ErrPermanent)
	})
	t.Run("missing bind source makes no call", func(t *testing.T) {
		t.Parallel()
		rt := newRuntime(&fakeClient{}, Config{}.withDefaults())
		spec := validSpecWithoutMounts()
		spec.Mounts = []jail.Mount{{Source: "/nonexistent/jetcrew", Target: "/data"}}
		_, err := rt.Start(context.Background(), spec, nil)
		require.ErrorIs(t, err, jail.ErrPermanent)
		require.ErrorContains(t, err, "bind mount source for /data: stat /nonexistent/jetcrew: no such file or directory")
	})
}

func validSpecWithoutMounts() jail.ContainerSpec {
	s := validSpec()
	s.Mounts = nil
	return s
}
