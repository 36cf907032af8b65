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
