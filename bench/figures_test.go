package bench

// This file has no build tag: `make test` runs it. It checks that the figures
// the prose quotes (BENCHMARKS.md, docs/deploy.md) are the ones the latest
// `make bench` recorded in bench/results.json, so a new measurement cannot
// leave the text describing an older one.

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// quote is a sentence fragment a document must contain, built from the
// recorded figures.
type quote struct {
	file string
	text func(f map[string]float64) string
}

// thousands formats v rounded to an integer with ',' between thousands.
func thousands(v float64) string {
	s := fmt.Sprintf("%d", int64(math.Round(v)))
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

var quotes = []quote{
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("%.0f ms at p50 against %.0f ms", f["dispatch_to_start_p50_ms"], f["raw_docker_start_p50_ms"])
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("%.0f ms against %.0f ms at p99", f["dispatch_to_start_p99_ms"], f["raw_docker_start_p99_ms"])
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("(%.0f ms without)", f["dispatch_to_start_nocoord_p50_ms"])
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("%s no-op runs/s", thousands(f["noop_runs_per_s"]))
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("%s on an R3 cluster", thousands(f["noop_r3_runs_per_s"]))
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("coordination off, %s (%.2f×) and %s (%.2f×)", thousands(f["noop_nocoord_runs_per_s"]),
			f["noop_nocoord_runs_per_s"]/f["raw_js_msgs_per_s"], thousands(f["noop_r3_nocoord_runs_per_s"]),
			f["noop_r3_nocoord_runs_per_s"]/f["raw_js_r3_msgs_per_s"])
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("takes %.2f ms at p50", f["coord_rtt_p50_ms"])
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("idle worker is %.0f MiB", f["worker_rss_idle_mib"])
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("%.1f, %.1f and %.1f runs/s", f["scale_1w_runs_per_s"], f["scale_2w_runs_per_s"], f["scale_4w_runs_per_s"])
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("%.1f s against %.2f s for moving the same file by hand (%.1f×", f["workspace_submit_to_tree_ms"]/1000,
			f["raw_object_put_get_untar_ms"]/1000, f["workspace_submit_to_tree_ms"]/f["raw_object_put_get_untar_ms"])
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("the snapshot %.1f s, of which HEAD's history %.1f s", f["workspace_stage_snapshot_ms"]/1000, f["workspace_stage_history_ms"]/1000)
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		if n := f["warm_dispatch_to_start_not_warm"]; n != 0 {
			return fmt.Sprintf("%.0f of the 100 samples started cold", n)
		}
		return "every one of the 100 samples started warm"
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("reads the clock %.1f ms after its submit began at p50 and %.1f ms at p99: %.3f× and %.3f× a bare create+start",
			f["warm_dispatch_to_start_p50_ms"], f["warm_dispatch_to_start_p99_ms"],
			f["warm_dispatch_to_start_p50_ms"]/f["raw_docker_start_p50_ms"], f["warm_dispatch_to_start_p99_ms"]/f["raw_docker_start_p99_ms"])
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("against %.0f ms for the cold start of the same jail", f["dispatch_to_start_p50_ms"])
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("stamps the `started` event at %.1f ms", f["warm_dispatch_to_started_event_p50_ms"])
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("the 4 warm runs started in %.1f ms at p50 (the slowest %.1f ms), and the 16 cold ones in %.0f ms at p50, %.2f× the same ranks of a burst of 20 without a pool (%.0f ms",
			f["warm_burst_first4_start_p50_ms"], f["warm_burst_first4_start_max_ms"], f["warm_burst_cold_start_p50_ms"],
			f["warm_burst_cold_start_p50_ms"]/f["cold_burst_rest_start_p50_ms"], f["cold_burst_rest_start_p50_ms"])
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("the last of the 20 started at %.0f ms, against %.0f ms without a pool", f["warm_burst_last_start_ms"], f["cold_burst_last_start_ms"])
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("full again %.0f ms after the burst began, %.1f× its first fill with nothing else running (%.0f ms)",
			f["warm_refill_ms"], f["warm_refill_ms"]/f["warm_fill_idle_ms"], f["warm_fill_idle_ms"])
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("reaches the watcher %.0f ms after its submit, against %.0f ms cold (%.2f×; runc: %.0f against %.0f ms, %.2f×)",
			f["runtime_runsc_warm_dispatch_to_output_p50_ms"], f["runtime_runsc_dispatch_to_output_p50_ms"],
			f["runtime_runsc_warm_dispatch_to_output_p50_ms"]/f["runtime_runsc_dispatch_to_output_p50_ms"],
			f["runtime_runc_warm_dispatch_to_output_p50_ms"], f["runtime_runc_dispatch_to_output_p50_ms"],
			f["runtime_runc_warm_dispatch_to_output_p50_ms"]/f["runtime_runc_dispatch_to_output_p50_ms"])
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("costs %.0f KiB of the worker's memory (VmRSS with 16 idle warm containers less without, per container), %.1f MiB for the engine's shim and %.1f MiB in the container itself",
			f["worker_rss_per_warm_container_kib"], f["docker_shim_rss_per_warm_container_kib"]/1024, f["warm_container_mem_kib"]/1024)
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("%.0f ms at p50 against %.0f ms under runc (%.2f×); a bare create+start %.2f×",
			f["runtime_runsc_dispatch_to_output_p50_ms"], f["runtime_runc_dispatch_to_output_p50_ms"],
			f["runtime_runsc_dispatch_to_output_p50_ms"]/f["runtime_runc_dispatch_to_output_p50_ms"],
			f["runtime_runsc_raw_create_start_p50_ms"]/f["runtime_runc_raw_create_start_p50_ms"])
	}},
	{"../BENCHMARKS.md", func(f map[string]float64) string {
		return fmt.Sprintf("takes %.2f s from the run's last act to its final state, against %.2f s for git doing the same by hand on a tmpfs (%.1f×",
			f["workspace_capture_1000_files_ms"]/1000, f["raw_git_capture_1000_files_ms"]/1000,
			f["workspace_capture_1000_files_ms"]/f["raw_git_capture_1000_files_ms"])
	}},
	{"../docs/deploy.md", func(f map[string]float64) string {
		return fmt.Sprintf("do %.1f, %.1f and %.1f runs/s", f["scale_1w_runs_per_s"], f["scale_2w_runs_per_s"], f["scale_4w_runs_per_s"])
	}},
	{"../docs/deploy.md", func(f map[string]float64) string {
		return fmt.Sprintf("%.2f× one worker", f["scale_4w_runs_per_s"]/f["scale_1w_runs_per_s"])
	}},
	{"../docs/deploy.md", func(f map[string]float64) string {
		return fmt.Sprintf("does %s no-op runs/s", thousands(f["noop_r3_runs_per_s"]))
	}},
	{"../docs/deploy.md", func(f map[string]float64) string {
		return fmt.Sprintf("and %s with coordination off", thousands(f["noop_r3_nocoord_runs_per_s"]))
	}},
	{"../docs/deploy.md", func(f map[string]float64) string {
		return fmt.Sprintf("%.1f MiB idle and about %.0f KiB per run", f["worker_rss_idle_mib"], f["worker_rss_per_run_kib"])
	}},
}

func TestQuotedFiguresMatchResults(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("results.json")
	require.NoError(t, err)
	var res struct {
		Figures map[string]struct {
			Value float64 `json:"value"`
		} `json:"figures"`
	}
	require.NoError(t, json.Unmarshal(data, &res))
	f := map[string]float64{}
	for k, v := range res.Figures {
		f[k] = v.Value
	}
	docs := map[string]string{}
	for _, q := range quotes {
		if _, ok := docs[q.file]; !ok {
			b, err := os.ReadFile(q.file)
			require.NoError(t, err)
			docs[q.file] = strings.Join(strings.Fields(string(b)), " ") // line breaks are spaces
		}
		want := strings.Join(strings.Fields(q.text(f)), " ")
		require.True(t, strings.Contains(docs[q.file], want),
			"%s does not quote %q from bench/results.json: update the prose to the latest make bench", q.file, want)
	}
}
