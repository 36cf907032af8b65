//go:build bench

package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
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

// Samples per OCI runtime of the runtimes benchmark, after runtimesWarmup.
const (
	runtimesSamples = 40
	runtimesWarmup  = 2
)

// benchRuntimes are the OCI runtimes compared, runc first (the baseline).
// A runtime the engine lacks, or that cannot start a container on this
// host, is reported and left out; without a usable runsc the comparison is
// skipped, saying so.
var benchRuntimes = []string{"runc", "runsc", "crun"}

// TestDispatchToStartRuntimes measures, under each OCI runtime in the same
// run, samples alternating between them one container at a time:
//
//   - submit → first output byte: from the start of dispatcher.Submit until
//     the watcher receives the first byte the run's process wrote (`echo`,
//     its first act), through the worker and the hardened container of the
//     built-in shell profile (coordination on), under that runtime. The
//     process cannot read the host's clock under gVisor (adjtimex is not
//     permitted there), so the time is taken where its output arrives: the
//     output path is the same for every runtime.
//   - the bare engine: ContainerCreate + ContainerStart of the sandbox image
//     (network none, nothing else) under that runtime, until ContainerStart
//     returns.
//   - submit → first output byte of the same profile keeping warmPool warm
//     containers (issue 25), under that runtime: the pool full when each
//     sample begins (the refill waited for, untimed), each sample checked
//     to have started warm.
func TestDispatchToStartRuntimes(t *testing.T) {
	cli := dockerClient(t)
	ctx := context.Background()
	usable := usableRuntimes(t, cli)

	var toml strings.Builder
	for _, r := range usable {
		fmt.Fprintf(&toml, "[profiles.rt-%s]\nimage = \"jetcrew-sandbox:latest\"\ncommand = [\"/bin/sh\", \"-c\", \"{prompt}\"]\nrequire_bridge = false\nruntime = %q\n\n", r, r)
		fmt.Fprintf(&toml, "[profiles.rt-%s-warm]\nimage = \"jetcrew-sandbox:latest\"\ncommand = [\"/bin/sh\", \"-c\", \"{prompt}\"]\nrequire_bridge = false\nruntime = %q\nwarm = %d\n\n", r, r, warmPool)
	}
	ps, err := profile.ParseProfiles("runtimes", []byte(toml.String()))
	require.NoError(t, err)

	s := workertest.StartServer(t)
	rt, err := docker.New(ctx, docker.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rt.Close() })
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	workerID := "bench-rt-" + hex.EncodeToString(suffix)
	w := startBenchWorker(t, s, worker.Config{
		ID: workerID, Runtime: rt, Concurrency: 2, Profiles: ps, WarmMax: warmPool * len(usable),
		StateDir: workertest.StateDir(t), BridgePath: binary(t, "jetcrew-bridge"),
	})
	d, err := dispatcher.New(workertest.Connect(t, s))
	require.NoError(t, err)

	jet := map[string][]float64{}
	raw := map[string][]float64{}
	hot := map[string][]float64{}
	notWarm := map[string]int{}
	for _, r := range usable {
		waitWarmFull(t, w, "rt-"+r+"-warm")
	}
	for i := range runtimesWarmup + runtimesSamples {
		for _, r := range usable {
			p, _ := firstOutputSample(t, cli, d, "rt-"+r)
			h, warm := firstOutputSample(t, cli, d, "rt-"+r+"-warm")
			// The refill (a container start) ends before the next sample.
			waitWarmFull(t, w, "rt-"+r+"-warm")
			q := rawRuntimeSample(t, cli, workerID, r)
			if i < runtimesWarmup {
				continue
			}
			jet[r], raw[r] = append(jet[r], p), append(raw[r], q)
			if !warm {
				notWarm[r]++
				continue
			}
			hot[r] = append(hot[r], h)
		}
	}
	for _, r := range usable {
		base := func(name string) string {
			if r == "runc" {
				return ""
			}
			return name
		}
		record(t, "runtime_"+r+"_dispatch_to_output_p50_ms", Figure{Value: round(median(jet[r]), 1), Unit: "ms", Samples: len(jet[r]),
			Baseline: base("runtime_runc_dispatch_to_output_p50_ms"),
			What:     "OCI runtime " + r + ": submit → the watcher receives the run's first output byte (`echo`, its first act); built-in shell profile, coordination on, one run at a time, alternating runtimes"})
		record(t, "runtime_"+r+"_dispatch_to_output_p99_ms", Figure{Value: round(percentile(jet[r], 0.99), 1), Unit: "ms", Samples: len(jet[r]),
			Baseline: base("runtime_runc_dispatch_to_output_p99_ms"),
			What:     "as runtime_" + r + "_dispatch_to_output_p50_ms, p99 by nearest rank"})
		record(t, "runtime_"+r+"_raw_create_start_p50_ms", Figure{Value: round(median(raw[r]), 1), Unit: "ms", Samples: len(raw[r]),
			Baseline: base("runtime_runc_raw_create_start_p50_ms"),
			What:     "OCI runtime " + r + ": bare ContainerCreate + ContainerStart (jetcrew-sandbox:latest, network none), until ContainerStart returns"})
		require.NotEmpty(t, hot[r], "no sample of rt-%s-warm started warm", r)
		record(t, "runtime_"+r+"_warm_dispatch_to_output_p50_ms", Figure{Value: round(median(hot[r]), 1), Unit: "ms", Samples: len(hot[r]),
			Baseline: "runtime_" + r + "_dispatch_to_output_p50_ms",
			What: fmt.Sprintf("OCI runtime %s, warm start (issue 25): as runtime_%s_dispatch_to_output_p50_ms with warm = %d in the profile, the pool refilled before each sample (waited for, untimed), so every sample is a warm start; samples whose state did not say warm are left out: %d of %d",
				r, r, warmPool, notWarm[r], len(hot[r])+notWarm[r])})
		record(t, "runtime_"+r+"_warm_dispatch_to_output_p99_ms", Figure{Value: round(percentile(hot[r], 0.99), 1), Unit: "ms", Samples: len(hot[r]),
			Baseline: "runtime_" + r + "_dispatch_to_output_p99_ms",
			What:     "as runtime_" + r + "_warm_dispatch_to_output_p50_ms, p99 by nearest rank"})
	}
}

// usableRuntimes returns the benchRuntimes the engine has and that start a
// container here, logging why the others are left out. It fails the test
// when runc is not usable and skips it when runsc is not.
func usableRuntimes(t *testing.T, cli *client.Client) []string {
	t.Helper()
	info, err := cli.Info(context.Background())
	require.NoError(t, err)
	var usable []string
	for _, r := range benchRuntimes {
		if _, ok := info.Runtimes[r]; !ok {
			t.Logf("runtime %s: not registered with the engine; left out (scripts/install-runtimes.sh)", r)
			continue
		}
		if err := tryRuntime(cli, r); err != nil {
			t.Logf("runtime %s: registered but cannot start a container here; left out: %v", r, err)
			continue
		}
		usable = append(usable, r)
	}
	require.Contains(t, usable, "runc")
	if !slices.Contains(usable, "runsc") {
		t.Skip("runsc is not usable on this engine: the OCI runtime comparison was NOT measured (scripts/install-runtimes.sh, as root, installs it)")
	}
	return usable
}

// tryRuntime starts and removes one container under runtime r.
func tryRuntime(cli *client.Client, r string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := cli.ContainerCreate(ctx, &container.Config{Image: "jetcrew-sandbox:latest", Cmd: []string{"true"}},
		&container.HostConfig{NetworkMode: "none", Runtime: r}, nil, nil, "")
	if err != nil {
		return err
	}
	defer func() { _ = cli.ContainerRemove(context.Background(), c.ID, container.RemoveOptions{Force: true}) }()
	return cli.ContainerStart(ctx, c.ID, container.StartOptions{})
}

// firstOutputSample submits one `echo` run of profile and returns how long
// after the submit began its first output byte reached the watcher, in ms,
// and whether its state says it started warm. It returns once the run's
// container is gone.
func firstOutputSample(t *testing.T, cli *client.Client, d *dispatcher.Dispatcher, profile string) (float64, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	id, err := d.Submit(ctx, messages.RunRequest{Profile: profile, Prompt: "echo go"})
	require.NoError(t, err)
	var first time.Time
	fin, err := d.Watch(ctx, id, func(ev dispatcher.WatchEvent) error {
		if ev.Type == messages.EventOutput && first.IsZero() {
			first = time.Now()
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, messages.StateSucceeded, fin.State, "run %s: %s", id, fin.Reason)
	require.False(t, first.IsZero(), "run %s: no output", id)
	st, err := d.Status(ctx, id)
	require.NoError(t, err)
	waitGone(t, cli, filters.NewArgs(filters.Arg("label", jail.LabelRunID+"="+id)))
	if st.ContainerID != "" {
		// A warm container has no run's labels: it was made before its run.
		waitGone(t, cli, filters.NewArgs(filters.Arg("id", st.ContainerID)))
	}
	return ms(first.Sub(t0)), st.Warm
}

// rawRuntimeSample creates and starts one container of the sandbox image
// under runtime r and returns how long until ContainerStart returned, in
// ms. The container is removed before it returns.
func rawRuntimeSample(t *testing.T, cli *client.Client, owner, r string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	c, err := cli.ContainerCreate(ctx,
		&container.Config{Image: "jetcrew-sandbox:latest", Cmd: []string{"true"}, Labels: map[string]string{"io.jetcrew.bench": owner}},
		&container.HostConfig{NetworkMode: "none", Runtime: r}, nil, nil, "")
	require.NoError(t, err)
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = cli.ContainerRemove(rctx, c.ID, container.RemoveOptions{Force: true})
	}()
	require.NoError(t, cli.ContainerStart(ctx, c.ID, container.StartOptions{}))
	return ms(time.Since(t0))
}
