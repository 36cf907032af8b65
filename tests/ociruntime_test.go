package tests

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// TestStartProvesOCIRuntime: a worker proves at start, on the real engine,
// that every OCI runtime its profiles name starts a container. crun is
// registered here (scripts/install-runtimes.sh) but, on a host whose
// cgroups are hybrid, the engine answers every start under it with HTTP
// 500; the worker then refuses to start, with the engine's own words,
// instead of taking runs that would each fail and be retried. The test asks
// the engine directly first (a bare create and start under crun) and holds
// the worker to the same answer: refused with that error where crun cannot
// start a container, started where it can. A profile naming runc starts,
// its proof container gone. No proof container is ever left behind. The
// crun profile's image does not exist: the proof falls back to the sandbox
// image.
func TestStartProvesOCIRuntime(t *testing.T) {
	t.Parallel()
	rt, cli := jailDocker(t)
	ctx := context.Background()
	info, err := cli.Info(ctx)
	require.NoError(t, err)
	if _, ok := info.Runtimes["crun"]; !ok {
		msg := fmt.Sprintf("the engine has no \"crun\" runtime (it has %s); scripts/install-runtimes.sh registers it",
			strings.Join(slices.Sorted(maps.Keys(info.Runtimes)), ", "))
		if os.Getenv("JETCREW_REQUIRE_GVISOR") != "" {
			t.Fatal(msg + " (JETCREW_REQUIRE_GVISOR is set)")
		}
		t.Skip(msg)
	}
	engineErr := bareStart(t, cli, "crun")
	t.Logf("a bare container under crun: %v", engineErr)

	start := func(t *testing.T, runtime, image string) (string, error) {
		t.Helper()
		s := workertest.StartServer(t)
		profiles, err := profile.ParseProfiles(t.Name(), []byte(fmt.Sprintf(
			"[profiles.rt]\nimage = %q\ncommand = [\"/bin/sh\", \"-c\", \"{prompt}\"]\nruntime = %q\nrequire_bridge = false\n", image, runtime)))
		require.NoError(t, err)
		id := "rtp-" + randomHex(t)
		w, err := worker.New(workertest.Connect(t, s), worker.Config{ID: id, Runtime: rt, Profiles: profiles,
			BridgePath: jailBridge, StateDir: workertest.StateDir(t), FetchWait: 2 * time.Second})
		require.NoError(t, err)
		err = w.Start(ctx)
		if err == nil {
			require.NoError(t, w.Stop(ctx))
		}
		left, lerr := cli.ContainerList(ctx, container.ListOptions{All: true,
			Filters: filters.NewArgs(filters.Arg("label", jail.LabelWorker+"="+id))})
		require.NoError(t, lerr)
		require.Empty(t, left, "no proof container is left behind")
		return id, err
	}

	t.Run("crun", func(t *testing.T) {
		t.Parallel()
		_, err := start(t, "crun", "jetcrew-no-such-image:latest")
		if engineErr == nil {
			require.NoError(t, err, "crun starts containers on this host")
			return
		}
		require.ErrorIs(t, err, profile.ErrOCIRuntimeUnusable)
		require.ErrorContains(t, err, `runtime "crun" (profile "rt") could not start a container of image "jetcrew-sandbox:latest"`)
		require.ErrorContains(t, err, engineErr.Error(), "the engine's own words")
		t.Logf("worker start: %v", err)
	})

	t.Run("runc", func(t *testing.T) {
		t.Parallel()
		_, err := start(t, "runc", jailImage)
		require.NoError(t, err)
	})
}

// bareStart creates and starts a container of the test image under the
// OCI runtime named, with nothing of jetcrew's, removes it, and returns
// the engine's error (nil when it started).
func bareStart(t *testing.T, cli *client.Client, runtime string) error {
	t.Helper()
	ctx := context.Background()
	created, err := cli.ContainerCreate(ctx, &container.Config{Image: jailImage, Cmd: []string{"/bin/true"}, User: "65532:65532"},
		&container.HostConfig{Runtime: runtime, NetworkMode: "none"}, nil, nil, "jetcrew-test-bare-"+runtime+"-"+randomHex(t))
	require.NoError(t, err)
	defer func() {
		require.NoError(t, cli.ContainerRemove(context.WithoutCancel(ctx), created.ID, container.RemoveOptions{Force: true}))
	}()
	return cli.ContainerStart(ctx, created.ID, container.StartOptions{})
}
