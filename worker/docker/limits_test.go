package docker

import (
	"context"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/stretchr/testify/require"
)

// TestDockerRunLimitsFromInside checks, on a real engine, that a run's
// processes see the open-file limit and that the engine keeps the run's
// output only as the spec says (item 11): without OutputLogBytes the
// container's HostConfig says log driver "none" and there is no log file;
// with it, the "local" driver in 4 files of a quarter each, uncompressed,
// whose log holds the output. The nofile ulimit is in the HostConfig and the process
// itself sees RunNofile as its soft and hard limit.
func TestDockerRunLimitsFromInside(t *testing.T) {
	t.Parallel()
	rt := newDockerRuntime(t)

	for _, keep := range []int64{0, 8 << 20} {
		spec := sandboxSpec(t, rt, `echo "soft=$(ulimit -Sn) hard=$(ulimit -Hn)"; echo secret-output-line`)
		spec.OutputLogBytes = keep
		st, rec := run(t, rt, spec)
		require.Equal(t, 0, st.Code, "stderr: %s", rec.Stderr())
		require.Equal(t, "soft=1024 hard=1024\nsecret-output-line\n", rec.Stdout())

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		info, err := rt.cli.ContainerInspect(ctx, spec.Name)
		require.NoError(t, err)
		require.Len(t, info.HostConfig.Ulimits, 1)
		require.Equal(t, "nofile", info.HostConfig.Ulimits[0].Name)
		require.EqualValues(t, RunNofile, info.HostConfig.Ulimits[0].Soft)
		require.EqualValues(t, RunNofile, info.HostConfig.Ulimits[0].Hard)
		if keep == 0 {
			require.Equal(t, "none", info.HostConfig.LogConfig.Type)
			// The engine wrote no log file: with driver none there is no
			// LogPath.
			require.Empty(t, info.LogPath)
			continue
		}
		require.Equal(t, "local", info.HostConfig.LogConfig.Type)
		require.Equal(t, map[string]string{"max-size": "2097152", "max-file": "4", "compress": "false"}, info.HostConfig.LogConfig.Config)
		// The local driver keeps its files to itself (no LogPath); what
		// it kept is read through the logs endpoint.
		logs, err := rt.cli.ContainerLogs(ctx, spec.Name, container.LogsOptions{ShowStdout: true, ShowStderr: true})
		require.NoError(t, err)
		kept := &recorder{}
		require.NoError(t, demux(logs, kept.output, nil))
		require.NoError(t, logs.Close())
		require.Equal(t, rec.Stdout(), kept.Stdout(), "the engine kept the output")
	}
}
