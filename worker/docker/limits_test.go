package docker

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDockerRunLimitsFromInside checks, on a real engine, that a run's
// processes see the open-file limit and that the engine
// keeps no log of the run's output (item 11): the container's HostConfig
// says log driver "none" and the nofile ulimit, and the process itself sees
// RunNofile as its soft and hard limit.
func TestDockerRunLimitsFromInside(t *testing.T) {
	t.Parallel()
	rt := newDockerRuntime(t)

	spec := sandboxSpec(t, rt, `echo "soft=$(ulimit -Sn) hard=$(ulimit -Hn)"; echo secret-output-line`)
	st, rec := run(t, rt, spec)
	require.Equal(t, 0, st.Code, "stderr: %s", rec.Stderr())
	require.Equal(t, "soft=1024 hard=1024\nsecret-output-line\n", rec.Stdout())

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := rt.cli.ContainerInspect(ctx, spec.Name)
	require.NoError(t, err)
	require.Equal(t, "none", info.HostConfig.LogConfig.Type)
	require.Len(t, info.HostConfig.Ulimits, 1)
	require.Equal(t, "nofile", info.HostConfig.Ulimits[0].Name)
	require.EqualValues(t, RunNofile, info.HostConfig.Ulimits[0].Soft)
	require.EqualValues(t, RunNofile, info.HostConfig.Ulimits[0].Hard)
	// The engine wrote no log file: with driver none there is no LogPath.
	require.Empty(t, info.LogPath)
}
