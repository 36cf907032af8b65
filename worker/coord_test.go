package worker_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// runDirOf returns the host source of a spec's /run/jetcrew mount.
func runDirOf(spec jail.ContainerSpec) string {
	for _, m := range spec.Mounts {
		if m.Target == messages.ContainerRunDir {
			return m.Source
		}
	}
	return ""
}

// Two overlapping runs of one group reach each other through their staged
// sockets, with the sender stamped by the worker; the staged directory
// exists while a run lives and is gone after.
func TestCoordinationThroughStagedSockets(t *testing.T) {
	t.Parallel()
	type report struct {
		spec    jail.ContainerSpec
		mcpMode os.FileMode
		got     []relay.Message
		peers   []relay.Peer
		err     error
	}
	reports := make(chan report, 2)
	b := setup(t, func(c *worker.Config) {
		rt := workertest.NewTestRuntime(t)
		rt.Behave = func(spec jail.ContainerSpec) (workertest.Behaviour, error) {
			return func(ctx context.Context, spec jail.ContainerSpec, out jail.OutputFunc) jail.ExitStatus {
				rep := report{spec: spec}
				defer func() { reports <- rep }()
				dir := runDirOf(spec)
				fi, err := os.Stat(filepath.Join(dir, messages.MCPConfigName))
				if err != nil {
					rep.err = err
					return jail.ExitStatus{Code: 1}
				}
				rep.mcpMode = fi.Mode().Perm()
				cl := relay.NewClient(filepath.Join(dir, messages.SocketName))
				defer cl.Close()
				if rep.err = cl.Hello(ctx); rep.err != nil {
					return jail.ExitStatus{Code: 1}
				}
				me := spec.Labels[jail.LabelRunID]
				peer := map[string]string{"p1": "p2", "p2": "p1"}[me]
				// Wait until the peer is present, then greet it.
				deadline := time.Now().Add(10 * time.Second)
				for time.Now().Before(deadline) {
					st, err := cl.Status(ctx)
					if err == nil && len(st.Peers) == 1 {
						rep.peers = st.Peers
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				if _, rep.err = cl.Send(ctx, relay.SendRequest{To: peer, Body: "hello from " + me}); rep.err != nil {
					return jail.ExitStatus{Code: 1}
				}
				in, err := cl.Inbox(ctx, relay.InboxRequest{WaitSeconds: 10})
				rep.got, rep.err = in.Messages, err
				return jail.ExitStatus{}
			}, nil
		}
		c.Runtime = rt
	})
	b.submit(t, messages.RunRequest{ID: "p1", Profile: "shell", Group: "team"})
	b.submit(t, messages.RunRequest{ID: "p2", Profile: "shell", Group: "team"})
	for range 2 {
		rep := <-reports
		require.NoError(t, rep.err)
		me := rep.spec.Labels[jail.LabelRunID]
		require.Equal(t, os.FileMode(0o444), rep.mcpMode)
		require.Len(t, rep.got, 1, me)
		peer := map[string]string{"p1": "p2", "p2": "p1"}[me]
		require.Equal(t, peer, rep.got[0].From, "sender stamped by the worker")
		require.Equal(t, "hello from "+peer, rep.got[0].Body)
		require.Equal(t, peer, rep.peers[0].RunID)
		require.Contains(t, rep.spec.Env, "JETCREW_MCP_CONFIG=/run/jetcrew/mcp.json")
		require.Contains(t, rep.spec.Env, "JETCREW_GROUP=team")
		var targets []string
		for _, m := range rep.spec.Mounts {
			require.True(t, m.ReadOnly, m.Target)
			targets = append(targets, m.Target)
		}
		require.ElementsMatch(t, []string{"/run/jetcrew", "/opt/jetcrew/bridge"}, targets)
	}
	for _, id := range []string{"p1", "p2"} {
		st := b.waitFinal(t, id)
		require.Equal(t, messages.StateSucceeded, st.State)
		require.True(t, st.BridgeConnected)
		require.Equal(t, "available", st.Coordination)
	}
	// The run directories are gone once the runs ended.
	for _, s := range b.rt.Starts() {
		require.Eventually(t, func() bool { _, err := os.Stat(runDirOf(s)); return os.IsNotExist(err) }, 5*time.Second, 10*time.Millisecond)
	}
	// Coordination events are on the runs' event subjects.
	var kinds []string
	for _, m := range b.events(t, "p1") {
		if m.Subject() == messages.SubjectEvents("p1", messages.EventCoord) {
			kinds = append(kinds, string(m.Data()))
		}
	}
	require.NotEmpty(t, kinds)
}

// A run whose profile wants coordination is refused, before its container
// starts, when the bridge cannot be staged.
func TestCoordinationBridgeMissingRefusesRun(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *worker.Config) { c.BridgePath = "/nonexistent/jetcrew-bridge" })
	b.submit(t, messages.RunRequest{ID: "nb1", Profile: "shell"})
	st := b.waitFinal(t, "nb1")
	require.Equal(t, messages.StateFailed, st.State)
	require.Contains(t, st.Reason, "coordination bridge cannot be staged")
	require.Empty(t, b.rt.Starts())
}

func TestCoordinationOff(t *testing.T) {
	t.Parallel()
	ps, err := profile.ParseProfiles("p.toml", []byte("[profiles.solo]\nimage='jetcrew-sandbox:latest'\ncommand=['/bin/sh','-c','{prompt}']\ncoordination=false\n"))
	require.NoError(t, err)
	b := setup(t, func(c *worker.Config) { c.Profiles = ps; c.BridgePath = "/nonexistent" })
	b.submit(t, messages.RunRequest{ID: "off1", Profile: "solo", Prompt: "out x"})
	st := b.waitFinal(t, "off1")
	require.Equal(t, messages.StateSucceeded, st.State)
	require.Equal(t, "off", st.Coordination)
	require.Empty(t, b.rt.Starts()[0].Mounts)
}
