//go:build bench

package bench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// rssRuns is how many runs are in flight when the busy RSS is read.
const rssRuns = 50

// TestWorkerRSS measures the resident set (VmRSS in /proc/<pid>/status) of a
// real `bin/jetcrew worker` process with real Docker containers: idle, and
// with rssRuns runs of the built-in shell profile (coordination on) in
// flight at once, each container sleeping. The worker's own cost per run is
// (busy − idle) / rssRuns. Baselines, read in the same run: a bare Go
// program holding one NATS connection (bench/natsidle) for the idle figure,
// and, for the per-run figure, Docker's own per-container process on the
// host (containerd-shim-runc-v2, one per container), averaged over the same
// containers.
func TestWorkerRSS(t *testing.T) {
	cli := dockerClient(t)
	s := workertest.StartServer(t)
	url := s.ClientURL()

	// Baseline: a Go process with one NATS connection.
	idleBin := filepath.Join(t.TempDir(), "natsidle")
	build := exec.Command("go", "build", "-trimpath", "-o", idleBin, "./natsidle")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	idle := exec.Command(idleBin, url)
	idleOut, err := idle.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, idle.Start())
	t.Cleanup(func() { _ = idle.Process.Kill(); _ = idle.Wait() })
	line, err := bufio.NewReader(idleOut).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready\n", line)

	// The worker: bin/jetcrew worker, metrics on a free port.
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	id := "bench-rss-" + hex.EncodeToString(suffix)
	logPath := filepath.Join(t.TempDir(), "worker.log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	defer logFile.Close()
	wk := exec.Command(binary(t, "jetcrew"), "worker", "--nats", url, "--id", id,
		"--concurrency", strconv.Itoa(rssRuns), "--metrics-addr", "127.0.0.1:0", "--drain-timeout", "1s")
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
		// Whatever the worker left behind.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cs, _ := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", jail.LabelWorker+"="+id))})
		for _, c := range cs {
			_ = cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
		}
	})
	base := metricsURL(t, logPath)
	require.Eventually(t, func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond)

	// Idle: a few seconds after start, the median of five readings.
	time.Sleep(5 * time.Second)
	idleKiB := medianRSS(t, wk.Process.Pid)
	bareKiB := medianRSS(t, idle.Process.Pid)

	// Busy: rssRuns sleeping containers at once.
	d, err := dispatcher.New(workertest.Connect(t, s))
	require.NoError(t, err)
	for range rssRuns {
		_, err := d.Submit(context.Background(), messages.RunRequest{Profile: "shell", Prompt: "sleep 300"})
		require.NoError(t, err)
	}
	start := time.Now()
	require.Eventually(t, func() bool {
		m := scrape(t, base)
		return m["jetcrew_runs_started_total"] == rssRuns && m["jetcrew_runs_in_flight"] == rssRuns
	}, 3*time.Minute, 250*time.Millisecond)
	t.Logf("%d containers running after %s", rssRuns, time.Since(start).Round(time.Millisecond))
	time.Sleep(3 * time.Second)
	busyKiB := medianRSS(t, wk.Process.Pid)
	shimKiB := shimRSS(t, cli, id)

	perRun := float64(busyKiB-idleKiB) / rssRuns
	record(t, "natsidle_rss_mib", Figure{Value: round(float64(bareKiB)/1024, 1), Unit: "MiB",
		What: "a bare static Go program holding one NATS connection and a JetStream context (bench/natsidle), idle"})
	record(t, "worker_rss_idle_mib", Figure{Value: round(float64(idleKiB)/1024, 1), Unit: "MiB", Baseline: "natsidle_rss_mib",
		What: "`bin/jetcrew worker --concurrency 50 --metrics-addr …` with the Docker runtime, ready and idle for 5 s (VmRSS, median of 5 readings)"})
	record(t, "docker_shim_rss_per_container_kib", Figure{Value: round(shimKiB, 0), Unit: "KiB", Samples: rssRuns,
		What: "Docker's own cost per running container on the host: VmRSS of its containerd-shim-runc-v2, averaged over the same 50 containers"})
	record(t, "worker_rss_per_run_kib", Figure{Value: round(perRun, 0), Unit: "KiB", Baseline: "docker_shim_rss_per_container_kib", Samples: rssRuns,
		What: fmt.Sprintf("(worker VmRSS with %d real containers of the built-in shell profile running `sleep` at once − idle) / %d; real Docker, coordination on (socket + inbox per run), attach stream per container", rssRuns, rssRuns)})
	t.Logf("worker idle %d KiB, busy %d KiB", idleKiB, busyKiB)
}

var metricsAddrLine = regexp.MustCompile(`"addr":"(127\.0\.0\.1:\d+)"[^\n]*"message":"serving /metrics`)

// metricsURL waits for the worker's log line naming its metrics address.
func metricsURL(t *testing.T, logPath string) string {
	t.Helper()
	var base string
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(logPath)
		if m := metricsAddrLine.FindSubmatch(b); m != nil {
			base = "http://" + string(m[1])
			return true
		}
		return false
	}, 30*time.Second, 50*time.Millisecond)
	return base
}

// scrape returns the worker's metrics without labels, by name.
func scrape(t *testing.T, base string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
			out[name] += v
		}
	}
	return out
}

// medianRSS returns the median of five VmRSS readings of pid, 200 ms apart,
// in KiB.
func medianRSS(t *testing.T, pid int) int64 {
	t.Helper()
	var xs []float64
	for i := range 5 {
		if i > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		kib, err := vmRSS(pid)
		require.NoError(t, err)
		xs = append(xs, float64(kib))
	}
	return int64(median(xs))
}

// shimRSS returns the mean VmRSS, in KiB, of the containerd-shim processes
// of the worker's running containers.
func shimRSS(t *testing.T, cli interface {
	ContainerList(context.Context, container.ListOptions) ([]container.Summary, error)
}, workerID string) float64 {
	t.Helper()
	cs, err := cli.ContainerList(context.Background(), container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", jail.LabelWorker+"="+workerID))})
	require.NoError(t, err)
	ids := map[string]bool{}
	for _, c := range cs {
		ids[c.ID] = true
	}
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	require.NoError(t, err)
	var total int64
	var n int
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), "containerd-shim") {
			continue
		}
		args := strings.Split(string(b), "\x00")
		for i, a := range args {
			if a == "-id" && i+1 < len(args) && ids[args[i+1]] {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
				if kib, err := vmRSS(pid); err == nil {
					total += kib
					n++
				}
			}
		}
	}
	require.Equal(t, len(ids), n, "a containerd-shim per running container")
	return float64(total) / float64(n)
}
