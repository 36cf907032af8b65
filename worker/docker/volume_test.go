package docker

import (
	"context"
	"testing"
	"time"

	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/stretchr/testify/require"
)

// TestDockerTmpfsVolume: a volume from CreateVolume is a tmpfs of its size
// and owner; a writer past the size gets ENOSPC; what it wrote outlives it
// while another running container mounts the volume; the volume is listed
// by its labels, cannot be removed while mounted, and is removed once free.
func TestDockerTmpfsVolume(t *testing.T) {
	t.Parallel()
	rt := newDockerRuntime(t)
	ctx := context.Background()
	name := "jetcrew-test-" + randomSuffix(t) + "-ws"
	labels := map[string]string{jail.LabelManaged: "true", jail.LabelRunID: "vol-" + name}
	require.NoError(t, rt.CreateVolume(ctx, jail.VolumeSpec{Name: name, SizeBytes: 1 << 20, UID: 65532, GID: 65532, Labels: labels}))
	t.Cleanup(func() { _ = rt.RemoveVolume(context.Background(), name) })

	holder := sandboxSpec(t, rt, "sleep 60")
	holder.Mounts = []jail.Mount{{Source: name, Volume: true, Target: "/ws", ReadOnly: true}}
	hc, _ := start(t, rt, holder)

	writer := sandboxSpec(t, rt, "stat -c '%u:%g %a' /ws; echo kept > /ws/a; dd if=/dev/zero of=/ws/fill bs=1M count=2 || echo ENOSPC; df -k /ws | tail -1")
	writer.Mounts = []jail.Mount{{Source: name, Volume: true, Target: "/ws"}}
	st, rec := run(t, rt, writer)
	require.Equal(t, 0, st.Code, rec.Stderr())
	require.Contains(t, rec.Stdout(), "65532:65532 755\n")
	require.Contains(t, rec.Stdout(), "ENOSPC\n")
	require.Contains(t, rec.Stderr(), "No space left on device")
	require.Regexp(t, `tmpfs\s+1024\s`, rec.Stdout(), "a 1 MiB tmpfs")

	reader := sandboxSpec(t, rt, "cat /ws/a")
	reader.Mounts = []jail.Mount{{Source: name, Volume: true, Target: "/ws", ReadOnly: true}}
	st, rec = run(t, rt, reader)
	require.Equal(t, 0, st.Code, rec.Stderr())
	require.Equal(t, "kept\n", rec.Stdout(), "the holder kept the tmpfs mounted")

	vols, err := rt.ListManagedVolumes(ctx)
	require.NoError(t, err)
	var found *jail.ManagedVolume
	for i := range vols {
		if vols[i].Name == name {
			found = &vols[i]
		}
	}
	require.NotNil(t, found)
	require.Equal(t, labels[jail.LabelRunID], found.Labels[jail.LabelRunID])
	require.WithinDuration(t, time.Now(), found.Created, 5*time.Minute)

	require.Error(t, rt.RemoveVolume(ctx, name), "a mounted volume stays")
	require.NoError(t, hc.Remove(ctx))
	require.NoError(t, rt.Remove(ctx, writer.Name))
	require.NoError(t, rt.Remove(ctx, reader.Name))
	require.NoError(t, rt.RemoveVolume(ctx, name))
	require.NoError(t, rt.RemoveVolume(ctx, name), "a missing volume counts as removed")

	// A volume that does not exist is refused, never created by the engine
	// (which would make an unbounded directory of its disk).
	missing := sandboxSpec(t, rt, "true")
	missing.Mounts = []jail.Mount{{Source: name, Volume: true, Target: "/ws"}}
	_, err = rt.Start(ctx, missing, func(string, []byte) {})
	require.ErrorIs(t, err, jail.ErrPermanent)
	_, err = rt.cli.VolumeInspect(ctx, name)
	require.Error(t, err, "no volume was created")

	// With its spec, a missing volume is created by the engine as the same
	// bounded tmpfs, labelled.
	spec := jail.VolumeSpec{Name: name, SizeBytes: 1 << 20, UID: 65532, GID: 65532, Inodes: 100, Labels: labels}
	auto := sandboxSpec(t, rt, "df -k /ws | tail -1; df -i /ws | tail -1")
	auto.Mounts = []jail.Mount{{Source: name, Volume: true, VolumeSpec: &spec, Target: "/ws"}}
	st, rec = run(t, rt, auto)
	require.Equal(t, 0, st.Code, rec.Stderr())
	require.Regexp(t, `tmpfs\s+1024\s`, rec.Stdout(), "a 1 MiB tmpfs")
	require.Regexp(t, `tmpfs\s+100\s`, rec.Stdout(), "100 inodes")
	v, err := rt.cli.VolumeInspect(ctx, name)
	require.NoError(t, err)
	require.Equal(t, labels[jail.LabelRunID], v.Labels[jail.LabelRunID])
	require.NoError(t, rt.Remove(ctx, auto.Name))
	require.NoError(t, rt.RemoveVolume(ctx, name))
}

// TestDockerSignal: Signal reaches the container's process through its
// init; a container that has exited is an error.
func TestDockerSignal(t *testing.T) {
	t.Parallel()
	rt := newDockerRuntime(t)
	ctx := context.Background()
	spec := sandboxSpec(t, rt, "trap 'echo got USR1; exit 3' USR1; echo ready; while :; do sleep 0.1; done")
	c, rec := start(t, rt, spec)
	waitForOutput(t, rec, "ready\n")
	require.NoError(t, c.Signal(ctx, "SIGUSR1"))
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := c.Wait(wctx)
	require.NoError(t, err)
	require.Equal(t, 3, st.Code)
	require.Contains(t, rec.Stdout(), "got USR1")
	require.Error(t, c.Signal(ctx, "SIGUSR1"), "an exited container")
}
