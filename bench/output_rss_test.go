//go:build bench

package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// outputFloodBytes is what the flooding run writes to stdout.
const outputFloodBytes = 1_000_000_000

// TestWorkerRSSOutputFlood measures the worker's resident set while one run
// writes 1 GB of output: a real `bin/jetcrew worker`, a
// profile with max_output_mib = -1 (every byte published, so the bounded
// window of unacknowledged publishes is what is measured, not the budget)
// and a 512 MiB container running `head -c 1000000000 /dev/zero`. It
// records the worker's peak VmRSS against its idle VmRSS (goal: within
// 64 MiB), and the container's own peak memory usage (cgroup) beside it.
func TestWorkerRSSOutputFlood(t *testing.T) {
	cli := dockerClient(t)
	s := workertest.StartServer(t)
	profilesPath := filepath.Join(t.TempDir(), "profiles.toml")
	require.NoError(t, os.WriteFile(profilesPath, []byte(`[profiles.flood]
image          = "jetcrew-sandbox:latest"
command        = ["/bin/sh", "-c", "{prompt}"]
coordination   = false
memory_mib     = 512
max_output_mib = -1
`), 0o644))
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	id := "bench-flood-" + hex.EncodeToString(suffix)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "worker.log"))
	require.NoError(t, err)
	defer logFile.Close()
	wk := exec.Command(binary(t, "jetcrew"), "worker", "--nats", s.ClientURL(), "--id", id,
		"--profiles", profilesPath, "--events-max-mib", "2048", "--drain-timeout", "1s")
	wk.Stdout, wk.Stderr = logFile, logFile
	require.NoError(t, wk.Start())
	exited := make(chan error, 1)
	go func() { exited <- wk.Wait() }()
	t.Cleanup(func() {
		_ = wk.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			_ = wk.Process.Kill()
			<-exited
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cs, _ := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", jail.LabelWorker+"="+id))})
		for _, c := range cs {
			_ = cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
		}
	})
	nc := workertest.Connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := js.Consumer(context.Background(), messages.StreamRuns, messages.ConsumerName(messages.DefaultPool))
		return err == nil
	}, 30*time.Second, 50*time.Millisecond)
	time.Sleep(3 * time.Second)
	idleKiB := medianRSS(t, wk.Process.Pid)

	d, err := dispatcher.New(nc)
	require.NoError(t, err)
	runID, err := d.Submit(context.Background(), messages.RunRequest{Profile: "flood", Prompt: "head -c 1000000000 /dev/zero"})
	require.NoError(t, err)
	var peakKiB, peakCtr int64
	start := time.Now()
	var st messages.RunState
	for time.Since(start) < 10*time.Minute {
		if kib, err := vmRSS(wk.Process.Pid); err == nil {
			peakKiB = max(peakKiB, kib)
		}
		peakCtr = max(peakCtr, containerMem(t, cli, id))
		if got, ok := runState(js, runID); ok && got.State.Final() {
			st = got
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.EqualValues(t, outputFloodBytes, st.OutputBytes)
	afterKiB := medianRSS(t, wk.Process.Pid)
	record(t, "worker_rss_output_flood_peak_mib", Figure{Value: round(float64(peakKiB)/1024, 1), Unit: "MiB", Baseline: "worker_rss_output_flood_idle_mib",
		What: "peak VmRSS of `bin/jetcrew worker` while one run (512 MiB container, max_output_mib = -1) writes 1 GB to stdout, every byte published (goal: within 64 MiB of idle)"})
	record(t, "worker_rss_output_flood_idle_mib", Figure{Value: round(float64(idleKiB)/1024, 1), Unit: "MiB",
		What: "the same worker's VmRSS, idle, before the run (median of 5 readings)"})
	record(t, "worker_rss_output_flood_after_mib", Figure{Value: round(float64(afterKiB)/1024, 1), Unit: "MiB", Baseline: "worker_rss_output_flood_idle_mib",
		What: "the same worker's VmRSS after the run ended (median of 5 readings)"})
	record(t, "container_mem_output_flood_peak_mib", Figure{Value: round(float64(peakCtr)/(1<<20), 1), Unit: "MiB",
		What: "the flooding container's own peak memory usage (cgroup, from the engine's stats), for comparison"})
	t.Logf("1 GB of output in %s", time.Since(start).Round(time.Millisecond))
}

// runState reads a run's state, if any.
func runState(js jetstream.JetStream, id string) (messages.RunState, bool) {
	var st messages.RunState
	kv, err := js.KeyValue(context.Background(), messages.BucketRuns)
	if err != nil {
		return st, false
	}
	e, err := kv.Get(context.Background(), id)
	if err != nil {
		return st, false
	}
	return st, json.Unmarshal(e.Value(), &st) == nil
}

// containerMem returns the memory usage in bytes of the worker's running
// container (cgroup usage as the engine's one-shot stats report it), 0 when
// none runs.
func containerMem(t *testing.T, cli *client.Client, workerID string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cs, err := cli.ContainerList(ctx, container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", jail.LabelWorker+"="+workerID))})
	if err != nil || len(cs) == 0 {
		return 0
	}
	resp, err := cli.ContainerStatsOneShot(ctx, cs[0].ID)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var v container.StatsResponse
	if json.NewDecoder(resp.Body).Decode(&v) != nil {
		return 0
	}
	return int64(v.MemoryStats.Usage)
}
