package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// The table of `jetcrew workers`: a worker's warm pools as ready/target,
// a pool that backs off marked and its refusal below the table, escaped
// like everything a worker wrote; an older worker's bare heartbeat shows
// its age alone.
func TestPrintWorkers(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	var b strings.Builder
	require.NoError(t, printWorkers(&b, []dispatcher.WorkerBeat{
		{ID: "old", Beat: now.Add(-4 * time.Second)},
		{ID: "w1", Beat: now.Add(-1200 * time.Millisecond), Pool: "default", Concurrency: 4, Warm: []messages.WarmPool{
			{Profile: "hot", Target: 2, Ready: 2},
			{Profile: "shell", Target: 1, Error: "create: No such image: x\x1b[2J\nforged line"},
		}},
		{ID: "w2", Pool: "gpu", Concurrency: 1},
	}, now))
	require.Equal(t, ""+
		"WORKER  POOL     CONCURRENCY  HEARTBEAT  WARM (READY/TARGET)\n"+
		"old     -        -            4s ago     -\n"+
		"w1      default  4            1s ago     hot 2/2, shell 0/1 (backing off)\n"+
		"w2      gpu      1            -          -\n"+
		"\n"+
		`worker w1, warm pool shell backs off: create: No such image: x\x1b[2J\nforged line`+"\n", b.String())
}

// warmShellProfiles writes a profiles file whose profile hot keeps n warm
// containers.
func warmShellProfiles(t *testing.T, n int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "profiles.toml")
	require.NoError(t, os.WriteFile(path, fmt.Appendf(nil, `[profiles.hot]
image          = "jetcrew-sandbox:latest"
command        = ["/bin/sh", "-c", "{prompt}"]
require_bridge = false
warm           = %d
`, n), 0o644))
	return path
}

// A worker whose profile keeps a warm container shows it on `jetcrew
// workers` (and in --json, as its presence value); a run of that profile
// starts in it, and submit --wait's started line and status say so.
func TestWorkersShowsWarmPools(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	url := s.ClientURL()
	code, stdout, stderr := cli(t, url, "workers")
	require.Equal(t, 1, code, "no workers bucket before any worker: %s", stdout)
	require.Contains(t, stderr, "jetcrew up")

	startWorker(t, s, "--id", "warm-worker", "--concurrency", "2", "--profiles", warmShellProfiles(t, 1))
	require.Eventually(t, func() bool {
		_, stdout, _ = cli(t, url, "workers")
		return strings.Contains(stdout, "hot 1/1")
	}, 20*time.Second, 50*time.Millisecond, "the warm pool never showed ready: %s", stdout)
	require.Regexp(t, `^WORKER +POOL +CONCURRENCY +HEARTBEAT +WARM \(READY/TARGET\)\nwarm-worker +default +2 +\d+s ago +hot 1/1\n$`, stdout)

	code, stdout, stderr = cli(t, url, "workers", "--json")
	require.Equal(t, 0, code, stderr)
	var ps []messages.WorkerPresence
	require.NoError(t, json.Unmarshal([]byte(stdout), &ps))
	require.Len(t, ps, 1)
	require.Equal(t, "warm-worker", ps[0].Worker)
	require.Equal(t, "default", ps[0].Pool)
	require.Equal(t, 2, ps[0].Concurrency)
	require.WithinDuration(t, time.Now(), ps[0].Time, messages.WorkerTTL)
	require.Equal(t, []messages.WarmPool{{Profile: "hot", Target: 1, Ready: 1}}, ps[0].Warm)

	code, stdout, stderr = cli(t, url, "submit", "--wait", "--id", "warm-run", "--profile", "hot", "out hello")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "hello\n", stdout)
	require.Regexp(t, `--- started: attempt 1 on worker warm-worker, container \S+ \(warm\)\n`, stderr)

	code, stdout, stderr = cli(t, url, "status", "warm-run")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "yes (started in a warm container)")
}

// An empty workers bucket lists nothing: the header alone, or [] in JSON.
func TestWorkersNone(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	nc := workertest.Connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: messages.BucketWorkers})
	require.NoError(t, err)
	code, stdout, stderr := cli(t, s.ClientURL(), "workers")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "WORKER  POOL  CONCURRENCY  HEARTBEAT  WARM (READY/TARGET)\n", stdout)
	code, stdout, stderr = cli(t, s.ClientURL(), "workers", "--json")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "[]\n", stdout)
}
