package tests

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// File claims between two real runs in real containers, through the MCP
// bridge the worker mounts (issue 29): the second run's overlapping claim is
// refused, told who holds it; the holder's claim survives a quiet period of
// its holder and is gone the moment the holder is cancelled.
func TestClaimsBetweenRuns(t *testing.T) {
	// A short AckWait: the quiet period below lasts more than three of
	// them, so a claim tied to anything but the run's lease (a timer, the
	// agent's own calls) would lapse.
	env := coordUp(t, "--ack-wait", "3s")
	const g = "claims-e2e"
	submitAgent(t, env.url, "holder", g, `call claim '{"paths":["src/**"],"reason":"rewriting src"}'; sleep 10m`)
	waitRunning(t, env.url, "holder")
	nc, err := nats.Connect(env.url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	var held []messages.CoordClaim
	require.Eventually(t, func() bool {
		held = groupClaims(t, js, g)
		return len(held) == 1
	}, time.Minute, 100*time.Millisecond, "the holder's claim never showed in %s", coordination.BucketClaims)
	require.Equal(t, "src/**", held[0].Pattern)
	require.Equal(t, "holder", held[0].RunID, "the worker stamps the holder")
	require.Equal(t, "rewriting src", held[0].Reason)

	submitAgent(t, env.url, "peer", g, `call claim '{"paths":["src/main.go"],"reason":"fix main"}'; expect-error "claimed by run holder since"; call claims '{}'; call release '{"paths":["src/main.go"]}'; expect-error "you hold no claim"`)
	rep, _ := finishedAgent(t, env.url, "peer", g)
	require.Len(t, rep.ToolErrors, 2, "the overlapping claim and the release of what it does not hold")
	require.Equal(t, "claim", rep.ToolErrors[0].Tool)
	require.Contains(t, rep.ToolErrors[0].Text, `"src/**"`)
	require.Contains(t, rep.ToolErrors[0].Text, "rewriting src")

	// Quiet: the holder calls nothing for over three AckWaits, its
	// delivery kept in progress by the worker alone, and keeps its claim.
	time.Sleep(10 * time.Second)
	require.Equal(t, held, groupClaims(t, js, g), "a quiet holder keeps its claim")

	r := run(t, env.url, jetcrewBin, "cancel", "holder")
	require.Equal(t, 0, r.code, r.stderr)
	cancelled := time.Now()
	require.Eventually(t, func() bool { return len(groupClaims(t, js, g)) == 0 }, 30*time.Second, 20*time.Millisecond,
		"the cancelled holder's claim stayed")
	t.Logf("claim gone %s after the cancel was acknowledged", time.Since(cancelled).Round(time.Millisecond))
	st := waitFinal(t, env.url, "holder")
	require.Equal(t, messages.StateCancelled, st.State)
	evs := coordEvents(t, env.url, "holder")
	kinds := strings.Join(eventStrings(eventKinds(evs)), " ")
	require.Contains(t, kinds, string(coordination.EventClaimed))
	require.Contains(t, kinds, string(coordination.EventReleased))
}

// Claims through a symlink of the workspace, in real containers: each
// run's bridge sees /workspace and claims "lnk/a.go" (lnk → src, a symlink
// of the snapshot) as "src/a.go", so it meets another run's claim of
// "src/a.go", and a new file named through the symlink is claimed by its
// target's path.
func TestClaimsThroughWorkspaceSymlinks(t *testing.T) {
	env := coordUp(t)
	ws := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(ws, "src"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "src", "a.go"), []byte("package a\n"), 0o644))
	require.NoError(t, os.Symlink("src", filepath.Join(ws, "lnk")))
	const g = "claims-links"
	submit := func(id, script string) {
		r := run(t, env.url, jetcrewBin, "submit", "--profile", "agent", "--id", id, "--group", g, "--workspace", ws, script)
		require.Equal(t, 0, r.code, "submit %s: %s", id, r.stderr)
	}
	submit("links-holder", `call claim '{"paths":["src/a.go"],"reason":"the store"}'; sleep 10m`)
	waitRunning(t, env.url, "links-holder")
	js := natsClient(t, env.url)
	require.Eventually(t, func() bool { return len(groupClaims(t, js, g)) == 1 }, time.Minute, 100*time.Millisecond)

	submit("links-peer", `call claim '{"paths":["lnk/a.go"],"reason":"also"}'; expect-error "claimed by run links-holder"; call claim '{"paths":["lnk/b.go"],"reason":"new"}'; sleep 10m`)
	var held []messages.CoordClaim
	require.Eventually(t, func() bool { held = groupClaims(t, js, g); return len(held) == 2 }, time.Minute, 100*time.Millisecond)
	got := map[string]string{}
	for _, c := range held {
		got[c.RunID] = c.Pattern
	}
	require.Equal(t, map[string]string{"links-holder": "src/a.go", "links-peer": "src/b.go"}, got)
	for _, id := range []string{"links-holder", "links-peer"} {
		r := run(t, env.url, jetcrewBin, "cancel", id)
		require.Equal(t, 0, r.code, r.stderr)
		require.Equal(t, messages.StateCancelled, waitFinal(t, env.url, id).State)
	}
	var refused []coordination.Event
	for _, ev := range coordEvents(t, env.url, "links-peer") {
		if ev.Kind == coordination.EventRefused {
			refused = append(refused, ev)
		}
	}
	require.Len(t, refused, 1)
	require.Contains(t, refused[0].Reason, `overlaps "src/a.go", claimed by run links-holder`)
}

// groupClaims reads group's claims from the claims bucket (none when it has
// no key).
func groupClaims(t *testing.T, js jetstream.JetStream, group string) []messages.CoordClaim {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, coordination.BucketClaims)
	require.NoError(t, err)
	e, err := kv.Get(ctx, coordination.ClaimKey(coordtest.Group(group)))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	require.NoError(t, err)
	var doc messages.CoordClaims
	require.NoError(t, json.Unmarshal(e.Value(), &doc))
	return doc.Claims
}

func eventStrings(kinds []coordination.EventKind) []string {
	out := make([]string, len(kinds))
	for i, k := range kinds {
		out[i] = string(k)
	}
	return out
}

// A claim's holder whose worker is killed with kill -9: the next worker
// adopts the run (issue 38), and the claim is kept across the adoption,
// not released and taken again: the same claim, of the same session, held
// by the run's first attempt throughout; it goes when the run ends.
func TestClaimKeptAcrossAdoption(t *testing.T) {
	requireAgentsImage(t)
	s := workertest.StartServer(t)
	url := s.ClientURL()
	js := natsClient(t, url)
	profiles := filepath.Join(t.TempDir(), "profiles.toml")
	require.NoError(t, os.WriteFile(profiles, []byte(agentProfiles), 0o644))
	flags := []string{"--profiles", profiles, "--ack-wait", "3s", "--concurrency", "2"}
	doomed := startOpsWorker(t, url, "claims-doomed", nil, flags...)
	workertest.WaitWorkerReady(t, js, messages.DefaultPool, 30*time.Second, "worker never started\n%s", doomed.stderr.String())

	const g, id = "claims-kill", "holder-k"
	submitAgent(t, url, id, g, `call claim '{"paths":["docs/**"],"reason":"rewriting docs"}'; sleep 10m`)
	var first []messages.CoordClaim
	require.Eventually(t, func() bool { first = groupClaims(t, js, g); return len(first) == 1 }, time.Minute, 100*time.Millisecond,
		"the claim never showed\n%s", doomed.stderr.String())

	before := waitRunning(t, url, id)
	require.NoError(t, doomed.cmd.Process.Kill())
	doomed.wait(t, 30*time.Second)
	// Nobody holds the lease yet: the claim stays (its holder's container
	// may still be at work).
	require.Equal(t, first, groupClaims(t, js, g))

	fresh := startOpsWorker(t, url, "claims-fresh", nil, flags...)
	st := waitState(t, url, id, func(st messages.RunState) bool { return st.Adoptions == 1 })
	require.Equal(t, messages.StateRunning, st.State)
	require.Equal(t, before.Attempts, st.Attempts, "the attempt goes on")
	require.Equal(t, "claims-fresh", st.Worker)
	// A claim holds while its session is its run's presence's
	// (messages.CoordClaims): the adopted run's presence goes on under the
	// session that made it.
	time.Sleep(2 * time.Second)
	require.Equal(t, first, groupClaims(t, js, g), "the claim is kept across the adoption\n%s", fresh.stderr.String())
	peers, err := js.KeyValue(t.Context(), coordination.BucketPeers)
	require.NoError(t, err)
	e, err := peers.Get(t.Context(), coordination.PeerKey(coordtest.Group(g), id))
	require.NoError(t, err)
	var p coordination.Presence
	require.NoError(t, json.Unmarshal(e.Value(), &p))
	require.Equal(t, first[0].Session, p.Session, "the adopted run's presence keeps its session")
	require.Equal(t, messages.StateRunning, p.State)

	r := run(t, url, jetcrewBin, "cancel", id)
	require.Equal(t, 0, r.code, r.stderr)
	require.Eventually(t, func() bool { return len(groupClaims(t, js, g)) == 0 }, 30*time.Second, 20*time.Millisecond)
	waitFinal(t, url, id)
}
