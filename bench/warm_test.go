//go:build bench

package bench

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/docker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// warmPool is the warm pool the warm start figures use: a profile's
// warm = 4, as issue 25 measures.
const warmPool = 4

// warmShell returns the built-in shell profile (coordination on) named
// name, keeping n warm containers: its jail is the shell profile's, so a
// cold run of "shell" and a warm run of it differ only in the pool.
func warmShell(t testing.TB, name string, n int) profile.Profile {
	t.Helper()
	p := profile.ShellProfile()
	p.Name, p.Warm = name, n
	p, err := p.Resolve()
	require.NoError(t, err)
	return p
}

// warmReady returns how many warm containers of profile prof the worker
// holds ready, and its target.
func warmReady(w *worker.Worker, prof string) (ready, target int) {
	for _, st := range w.WarmStatus() {
		if st.Profile == prof {
			return st.Ready, st.Target
		}
	}
	return 0, 0
}

// waitWarmFull waits until the worker's pool of prof is full (every
// container of its target ready) and returns how long that took.
func waitWarmFull(t testing.TB, w *worker.Worker, prof string) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ready, target := warmReady(w, prof)
		if target > 0 && ready == target {
			return time.Since(start)
		}
		if time.Since(start) > 2*time.Minute {
			t.Fatalf("the warm pool of %s holds %d of %d ready containers after %s", prof, ready, target, time.Since(start).Round(time.Millisecond))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Runs per burst and bursts of each kind of the burst benchmark.
const (
	burstRuns   = 20
	burstRounds = 5
)

// TestWarmBurst measures a burst of burstRuns runs submitted at once to one
// worker (concurrency burstRuns, real Docker) whose "warm" profile keeps
// warmPool warm containers: each run's start (submit → its process reads
// the clock), in order, the warmPool warm ones first and the others cold,
// and the time until the pool is full again. The baseline, in the same
// run, is the same burst of the built-in shell profile (the same jail,
// no pool), today's cold path: the cold runs of a warm burst are compared
// with the runs of the same ranks (warmPool+1 to burstRuns) of a cold
// burst. Rounds alternate cold burst, warm burst; each burst begins with
// every container of the one before removed and the pool full, and the
// pool's first fill after the worker started (nothing else running) is
// the refill's baseline.
func TestWarmBurst(t *testing.T) {
	cli := dockerClient(t)
	s := workertest.StartServer(t)
	ctx := context.Background()
	rt, err := docker.New(ctx, docker.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rt.Close() })
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	ps := profile.DefaultProfiles()
	ps["warm"] = warmShell(t, "warm", warmPool)
	w := startBenchWorker(t, s, worker.Config{
		ID: "bench-burst-" + hex.EncodeToString(suffix), Runtime: rt, Concurrency: burstRuns, Profiles: ps,
		StateDir: workertest.StateDir(t), BridgePath: binary(t, "jetcrew-bridge"),
	})
	fill := waitWarmFull(t, w, "warm")
	d, err := dispatcher.New(workertest.Connect(t, s))
	require.NoError(t, err)

	var coldRanks, warmRanks [burstRuns][]float64
	var refills []float64
	warmStarted := 0
	for range burstRounds {
		waitWarmFull(t, w, "warm")
		cold, _ := burst(t, cli, d, w, "shell")
		for i, r := range cold {
			require.False(t, r.warm)
			coldRanks[i] = append(coldRanks[i], r.start)
		}
		waitWarmFull(t, w, "warm")
		hot, refill := burst(t, cli, d, w, "warm")
		for i, r := range hot {
			warmRanks[i] = append(warmRanks[i], r.start)
			if r.warm {
				warmStarted++
				require.Less(t, i, warmPool, "a warm run started after a cold one")
			}
		}
		require.Positive(t, refill, "the pool was not full again within the burst's timeout")
		refills = append(refills, refill)
	}
	require.Equal(t, warmPool*burstRounds, warmStarted, "each warm burst starts exactly the pool's containers warm")

	flat := func(ranks [burstRuns][]float64, from, to int) []float64 {
		var out []float64
		for _, xs := range ranks[from:to] {
			out = append(out, xs...)
		}
		return out
	}
	byRank := func(ranks [burstRuns][]float64) string {
		var b strings.Builder
		for i, xs := range ranks {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%.0f", median(xs))
		}
		return b.String()
	}
	const how = "%d runs submitted at once (each from its own goroutine) to one worker of concurrency %d, real Docker; a run's start is its submit → its process reads the clock (adjtimex); %d bursts"
	coldHow := fmt.Sprintf(how, burstRuns, burstRuns, burstRounds)
	record(t, "cold_burst_first4_start_p50_ms", Figure{Value: round(median(flat(coldRanks, 0, warmPool)), 1), Unit: "ms", Samples: warmPool * burstRounds,
		What: fmt.Sprintf("today's cold path in a burst: %s of the built-in shell profile (no warm pool), p50 of the first %d to start; by rank, the median over the bursts (ms): %s", coldHow, warmPool, byRank(coldRanks))})
	record(t, "cold_burst_rest_start_p50_ms", Figure{Value: round(median(flat(coldRanks, warmPool, burstRuns)), 0), Unit: "ms", Samples: (burstRuns - warmPool) * burstRounds,
		What: fmt.Sprintf("as cold_burst_first4_start_p50_ms, p50 of the runs of ranks %d–%d (the ones a pool of %d leaves cold)", warmPool+1, burstRuns, warmPool)})
	record(t, "cold_burst_last_start_ms", Figure{Value: round(median(coldRanks[burstRuns-1]), 0), Unit: "ms", Samples: burstRounds, Repeats: coldRanks[burstRuns-1],
		What: fmt.Sprintf("as cold_burst_first4_start_p50_ms, the start of the last of the %d (median over the bursts)", burstRuns)})
	record(t, "warm_burst_first4_start_p50_ms", Figure{Value: round(median(flat(warmRanks, 0, warmPool)), 1), Unit: "ms", Baseline: "cold_burst_first4_start_p50_ms", Samples: warmPool * burstRounds,
		What: fmt.Sprintf("a burst on a warm pool (issue 25): %s of a profile with the shell profile's jail and warm = %d, the pool full before each, p50 of the first %d to start — every one of them warm, and no other (the run state's warm); by rank, the median over the bursts (ms): %s", coldHow, warmPool, warmPool, byRank(warmRanks))})
	record(t, "warm_burst_first4_start_max_ms", Figure{Value: round(slices.Max(flat(warmRanks, 0, warmPool)), 1), Unit: "ms", Samples: warmPool * burstRounds,
		What: "as warm_burst_first4_start_p50_ms, the slowest of the warm starts"})
	record(t, "warm_burst_cold_start_p50_ms", Figure{Value: round(median(flat(warmRanks, warmPool, burstRuns)), 0), Unit: "ms", Baseline: "cold_burst_rest_start_p50_ms", Samples: (burstRuns - warmPool) * burstRounds,
		What: fmt.Sprintf("as warm_burst_first4_start_p50_ms, p50 of the %d runs that found the pool empty and started cold (ranks %d–%d), while the pool refilled; issue 25's goal: at most 1.1× the same ranks of a cold burst", burstRuns-warmPool, warmPool+1, burstRuns)})
	record(t, "warm_burst_last_start_ms", Figure{Value: round(median(warmRanks[burstRuns-1]), 0), Unit: "ms", Baseline: "cold_burst_last_start_ms", Samples: burstRounds, Repeats: warmRanks[burstRuns-1],
		What: fmt.Sprintf("as warm_burst_first4_start_p50_ms, the start of the last of the %d (median over the bursts)", burstRuns)})
	record(t, "warm_fill_idle_ms", Figure{Value: round(ms(fill), 0), Unit: "ms",
		What: fmt.Sprintf("the pool's first fill: worker started → %d warm containers ready (made one at a time, nothing else running)", warmPool)})
	record(t, "warm_refill_ms", Figure{Value: round(median(refills), 0), Unit: "ms", Baseline: "warm_fill_idle_ms", Samples: burstRounds, Repeats: refills,
		What: fmt.Sprintf("a burst on a warm pool: its first submit → the pool holds %d ready containers again (made one at a time, beside the burst's cold starts; median over the bursts)", warmPool)})
}

// burstStart is one run of a burst: its start (submit → its process reads
// the clock) in ms and whether it started warm.
type burstStart struct {
	start float64
	warm  bool
}

// burst submits burstRuns runs of profile at once, waits until each ended
// and its container is gone, and returns their starts, fastest first, and
// how long after the first submit the worker's pool of profile was full
// again after the burst claimed from it (0 when the profile keeps none).
func burst(t *testing.T, cli *client.Client, d *dispatcher.Dispatcher, w *worker.Worker, prof string) ([]burstStart, float64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var refill atomic.Int64
	watching := make(chan struct{})
	t0 := time.Now()
	go func() {
		defer close(watching)
		_, target := warmReady(w, prof)
		if target == 0 {
			return
		}
		dropped := false
		for ctx.Err() == nil {
			ready, _ := warmReady(w, prof)
			switch {
			case ready < target:
				dropped = true
			case dropped:
				refill.Store(int64(time.Since(t0)))
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	go1 := make(chan struct{})
	out := make([]burstStart, burstRuns)
	containers := make([]string, burstRuns)
	errs := make([]error, burstRuns)
	var wg sync.WaitGroup
	for i := range burstRuns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-go1
			out[i], containers[i], errs[i] = burstRun(ctx, d, prof)
		}()
	}
	close(go1)
	wg.Wait()
	<-watching
	require.NoError(t, errors.Join(errs...))
	for _, c := range containers {
		require.NotEmpty(t, c, "a run's state names no container")
		waitGone(t, cli, filters.NewArgs(filters.Arg("id", c)))
	}
	slices.SortFunc(out, func(a, b burstStart) int { return cmp.Compare(a.start, b.start) })
	return out, ms(time.Duration(refill.Load()))
}

// burstRun submits one clockProbe run of profile and follows it to its
// end: its start and its container's id.
func burstRun(ctx context.Context, d *dispatcher.Dispatcher, prof string) (burstStart, string, error) {
	t0 := time.Now()
	id, err := d.Submit(ctx, messages.RunRequest{Profile: prof, Prompt: clockProbe})
	if err != nil {
		return burstStart{}, "", err
	}
	var out bytes.Buffer
	fin, err := d.Watch(ctx, id, func(ev dispatcher.WatchEvent) error {
		if ev.Type == messages.EventOutput && ev.Stream == messages.StreamStdout {
			out.Write(ev.Data)
		}
		return nil
	})
	if err != nil {
		return burstStart{}, "", err
	}
	if fin.State != messages.StateSucceeded {
		return burstStart{}, "", fmt.Errorf("run %s: %s: %s", id, fin.State, fin.Reason)
	}
	ran, err := probeTime(out.Bytes())
	if err != nil {
		return burstStart{}, "", fmt.Errorf("run %s: %w", id, err)
	}
	st, err := d.Status(ctx, id)
	if err != nil {
		return burstStart{}, "", err
	}
	return burstStart{start: ms(ran.Sub(t0)), warm: st.Warm}, st.ContainerID, nil
}

// warmRSSContainers is the pool the memory benchmark measures.
const warmRSSContainers = 16

// TestWarmRSS measures what an idle warm container costs in memory (issue
// 25), with a real `bin/jetcrew worker` process and real Docker: the
// worker's VmRSS, idle, with a pool of warmRSSContainers warm containers
// ready and waiting, minus the same worker's without a pool (a first
// process with --warm-max 0, then a second with the pool; same profile
// file, flags and server), per container; beside it, as rss_test.go's
// per-run figure, the VmRSS of Docker's own process per container
// (containerd-shim-runc-v2) averaged over the same containers, and each
// container's own memory (the waiting launcher and the init), as the
// engine's stats report it.
func TestWarmRSS(t *testing.T) {
	cli := dockerClient(t)
	s := workertest.StartServer(t)
	profPath := filepath.Join(t.TempDir(), "profiles.toml")
	require.NoError(t, os.WriteFile(profPath, fmt.Appendf(nil, `[profiles.warm]
image          = "jetcrew-sandbox:latest"
command        = ["/bin/sh", "-c", "{prompt}"]
require_bridge = false
warm           = %d
`, warmRSSContainers), 0o644))
	stateRoot := workertest.StateDir(t)
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)

	// Without a pool.
	cold := startWorkerProcess(t, cli, s.ClientURL(), "bench-wrss-0-"+hex.EncodeToString(suffix),
		"--profiles", profPath, "--warm-max", "0", "--state-dir", filepath.Join(stateRoot, "a"))
	time.Sleep(5 * time.Second)
	withoutKiB := medianRSS(t, cold.pid)
	cold.stop(t)

	// With one.
	hot := startWorkerProcess(t, cli, s.ClientURL(), "bench-wrss-"+strconv.Itoa(warmRSSContainers)+"-"+hex.EncodeToString(suffix),
		"--profiles", profPath, "--warm-max", strconv.Itoa(warmRSSContainers), "--state-dir", filepath.Join(stateRoot, "b"))
	start := time.Now()
	require.Eventually(t, func() bool { return scrape(t, hot.base)["jetcrew_warm_ready"] == warmRSSContainers },
		3*time.Minute, 100*time.Millisecond, "the pool never held %d ready containers", warmRSSContainers)
	t.Logf("%d warm containers ready after %s", warmRSSContainers, time.Since(start).Round(time.Millisecond))
	time.Sleep(5 * time.Second)
	withKiB := medianRSS(t, hot.pid)
	shimKiB := shimRSS(t, cli, hot.id)
	ctrKiB := meanContainerMemKiB(t, cli, hot.id)
	hot.stop(t)

	per := float64(withKiB-withoutKiB) / warmRSSContainers
	record(t, "docker_shim_rss_per_warm_container_kib", Figure{Value: round(shimKiB, 0), Unit: "KiB", Samples: warmRSSContainers,
		What: fmt.Sprintf("Docker's own cost per idle warm container on the host: VmRSS of its containerd-shim-runc-v2, averaged over a pool of %d", warmRSSContainers)})
	record(t, "worker_rss_per_warm_container_kib", Figure{Value: round(per, 0), Unit: "KiB", Baseline: "docker_shim_rss_per_warm_container_kib", Samples: warmRSSContainers,
		What: fmt.Sprintf("the worker's own memory per idle warm container (issue 25): (VmRSS of `bin/jetcrew worker` with a pool of %d ready warm containers of a profile with the shell profile's jail − the same without a pool, --warm-max 0: %.1f − %.1f MiB) / %d; each ready and idle 5 s, median of 5 readings",
			warmRSSContainers, float64(withKiB)/1024, float64(withoutKiB)/1024, warmRSSContainers)})
	record(t, "warm_container_mem_kib", Figure{Value: round(ctrKiB, 0), Unit: "KiB", Samples: warmRSSContainers,
		What: "an idle warm container's own memory: its cgroup's usage less inactive file pages (as `docker stats` shows it; the init and the launcher waiting on its hand-off socket), from the engine's one-shot stats, averaged over the same pool"})
}

// workerProcess is a `bin/jetcrew worker` started by startWorkerProcess.
type workerProcess struct {
	id, base string
	pid      int
	stop     func(t *testing.T)
}

// startWorkerProcess starts `bin/jetcrew worker` on the server at url with
// the given id, metrics on a free loopback port, and args, and waits until
// it is ready. stop (also a cleanup) stops it with SIGTERM and removes any
// container it left.
func startWorkerProcess(t *testing.T, cli *client.Client, url, id string, args ...string) workerProcess {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), id+".log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	wk := exec.Command(binary(t, "jetcrew"), append([]string{"worker", "--nats", url, "--id", id,
		"--metrics-addr", "127.0.0.1:0", "--drain-timeout", "1s"}, args...)...)
	wk.Stdout, wk.Stderr = logFile, logFile
	require.NoError(t, wk.Start())
	exited := make(chan error, 1)
	go func() { exited <- wk.Wait() }()
	var once sync.Once
	stop := func(t *testing.T) {
		once.Do(func() {
			_ = wk.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(60 * time.Second):
				_ = wk.Process.Kill()
				<-exited
			}
			_ = logFile.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cs, _ := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", jail.LabelWorker+"="+id))})
			for _, c := range cs {
				t.Logf("worker %s left container %s; removing it", id, c.Names)
				_ = cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
			}
		})
	}
	t.Cleanup(func() { stop(t) })
	base := metricsURL(t, logPath)
	require.Eventually(t, func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond)
	return workerProcess{id: id, base: base, pid: wk.Process.Pid, stop: stop}
}

// meanContainerMemKiB returns the mean memory of the worker's running
// containers in KiB, as `docker stats` computes it: the cgroup's usage
// less its inactive file pages, from the engine's one-shot stats.
func meanContainerMemKiB(t *testing.T, cli *client.Client, workerID string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := cli.ContainerList(ctx, container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", jail.LabelWorker+"="+workerID))})
	require.NoError(t, err)
	require.NotEmpty(t, cs)
	var total float64
	for _, c := range cs {
		resp, err := cli.ContainerStatsOneShot(ctx, c.ID)
		require.NoError(t, err)
		var v container.StatsResponse
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		require.NoError(t, err)
		used := float64(v.MemoryStats.Usage)
		if inactive, ok := v.MemoryStats.Stats["inactive_file"]; ok && float64(inactive) < used {
			used -= float64(inactive)
		}
		total += used / 1024
	}
	return total / float64(len(cs))
}
