package docker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/system"
	"github.com/docker/docker/client"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/stretchr/testify/require"
)

// ociFake answers Info with the given runtimes (or err) and counts the
// calls; ImageInspect says the image is missing, so a Start that got past
// the OCI runtime check ends there.
type ociFake struct {
	fakeClient
	mu       sync.Mutex
	runtimes []string
	err      error
	calls    int
}

func (f *ociFake) Info(context.Context) (system.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return system.Info{}, f.err
	}
	info := system.Info{Runtimes: map[string]system.RuntimeWithStatus{}}
	for _, n := range f.runtimes {
		info.Runtimes[n] = system.RuntimeWithStatus{}
	}
	return info, nil
}

func (f *ociFake) ImageInspect(context.Context, string, ...client.ImageInspectOption) (image.InspectResponse, error) {
	return image.InspectResponse{}, fmt.Errorf("No such image: %w", cerrdefs.ErrNotFound)
}

func (f *ociFake) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func TestStartOCIRuntime(t *testing.T) {
	t.Parallel()

	spec := func(runtime string) jail.ContainerSpec {
		s := validSpecWithoutMounts()
		s.OCIRuntime = runtime
		return s
	}
	const imageMissing = `image "jetcrew-sandbox:latest" not found`

	t.Run("unknown runtime is refused, permanently, naming the available ones", func(t *testing.T) {
		t.Parallel()
		f := &ociFake{runtimes: []string{"runc", "io.containerd.runc.v2"}}
		rt := newRuntime(f, Config{}.withDefaults())
		_, err := rt.Start(context.Background(), spec("runsc"), nil)
		require.ErrorIs(t, err, jail.ErrPermanent)
		require.EqualError(t, err, `docker: OCI runtime "runsc" is not installed on this Docker engine `+
			`(available: io.containerd.runc.v2, runc); register it in the daemon's "runtimes" (daemon.json) `+
			`or change the profile: permanent runtime error`)
	})
	t.Run("known runtime passes", func(t *testing.T) {
		t.Parallel()
		f := &ociFake{runtimes: []string{"runc", "runsc"}}
		rt := newRuntime(f, Config{}.withDefaults())
		_, err := rt.Start(context.Background(), spec("runsc"), nil)
		require.ErrorContains(t, err, imageMissing, "got past the runtime check")
	})
	t.Run("empty means the engine's default: no Info call", func(t *testing.T) {
		t.Parallel()
		f := &ociFake{}
		rt := newRuntime(f, Config{}.withDefaults())
		_, err := rt.Start(context.Background(), spec(""), nil)
		require.ErrorContains(t, err, imageMissing)
		require.Zero(t, f.Calls())
	})
	t.Run("cached for the TTL, then asked again", func(t *testing.T) {
		t.Parallel()
		f := &ociFake{runtimes: []string{"runc"}}
		rt := newRuntime(f, Config{OCIRuntimesTTL: time.Minute}.withDefaults())
		now := time.Unix(1_000_000, 0)
		rt.now = func() time.Time { return now }
		for range 5 {
			_, err := rt.Start(context.Background(), spec("runsc"), nil)
			require.ErrorIs(t, err, jail.ErrPermanent)
		}
		require.Equal(t, 1, f.Calls(), "one Info for five Starts within the TTL")

		// The operator installs runsc; after the TTL the worker sees it.
		f.mu.Lock()
		f.runtimes = append(f.runtimes, "runsc")
		f.mu.Unlock()
		now = now.Add(time.Minute)
		_, err := rt.Start(context.Background(), spec("runsc"), nil)
		require.ErrorContains(t, err, imageMissing)
		require.Equal(t, 2, f.Calls())
	})
	t.Run("Info failing is transient and not cached", func(t *testing.T) {
		t.Parallel()
		f := &ociFake{err: fmt.Errorf("restarting: %w", cerrdefs.ErrUnavailable)}
		rt := newRuntime(f, Config{RetryTimeout: 200 * time.Millisecond}.withDefaults())
		_, err := rt.Start(context.Background(), spec("runc"), nil)
		require.Error(t, err)
		require.NotErrorIs(t, err, jail.ErrPermanent)
		require.ErrorContains(t, err, "docker info: ")
		calls := f.Calls()

		f.mu.Lock()
		f.err, f.runtimes = nil, []string{"runc"}
		f.mu.Unlock()
		_, err = rt.Start(context.Background(), spec("runc"), nil)
		require.ErrorContains(t, err, imageMissing)
		require.Equal(t, calls+1, f.Calls())
	})
}
