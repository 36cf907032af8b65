package docker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/stretchr/testify/require"
)

// inspectFake answers ContainerInspect from a script of states, the last
// one repeating; a nil state means the container is gone.
type inspectFake struct {
	fakeClient
	mu     sync.Mutex
	states []*container.State
	calls  int
}

func (f *inspectFake) ContainerInspect(context.Context, string) (container.InspectResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.states[min(f.calls, len(f.states)-1)]
	f.calls++
	if s == nil {
		return container.InspectResponse{}, fmt.Errorf("No such container: %w", cerrdefs.ErrNotFound)
	}
	return container.InspectResponse{ContainerJSONBase: &container.ContainerJSONBase{State: s}}, nil
}

func exited(code int, oom bool) *container.State {
	return &container.State{Status: container.StateExited, ExitCode: code, OOMKilled: oom}
}

// TestInspectExitWaitsForLateOOM: the engine may record an OOM kill after
// the exit; a SIGKILLed process is inspected again until it does, for a
// while, and only then.
func TestInspectExitWaitsForLateOOM(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name      string
		states    []*container.State
		want      jail.ExitStatus
		wantCalls int
		slow      bool
	}{
		{"OOM recorded late", []*container.State{exited(137, false), exited(137, false), exited(137, true)}, jail.ExitStatus{Code: 137, OOMKilled: true}, 3, false},
		{"OOM recorded at once", []*container.State{exited(137, true)}, jail.ExitStatus{Code: 137, OOMKilled: true}, 1, false},
		{"other codes are not looked at again", []*container.State{exited(143, false)}, jail.ExitStatus{Code: 143}, 1, false},
		{"killed, never OOM: gives up after oomSettle", []*container.State{exited(137, false)}, jail.ExitStatus{Code: 137}, 0, true},
		{"removed meanwhile", []*container.State{exited(137, false), nil}, jail.ExitStatus{Code: 137}, 2, false},
	}
	t.Run("stopped by Stop: the SIGKILL is ours", func(t *testing.T) {
		t.Parallel()
		f := &inspectFake{states: []*container.State{exited(137, false), exited(137, true)}}
		c := &Container{id: "c1", rt: newRuntime(f, Config{}.withDefaults())}
		c.stopped.Store(true)
		st, err := c.inspectExit(context.Background())
		require.NoError(t, err)
		require.Equal(t, jail.ExitStatus{Code: 137}, st)
		require.Equal(t, 1, f.calls)
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := &inspectFake{states: tt.states}
			c := &Container{id: "c1", rt: newRuntime(f, Config{}.withDefaults())}
			began := time.Now()
			st, err := c.inspectExit(context.Background())
			require.NoError(t, err)
			require.Equal(t, tt.want, st)
			if tt.slow {
				require.GreaterOrEqual(t, time.Since(began), oomSettle)
			} else {
				require.Less(t, time.Since(began), oomSettle)
				require.Equal(t, tt.wantCalls, f.calls)
			}
		})
	}
}
