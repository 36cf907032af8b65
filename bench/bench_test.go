//go:build bench

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/client"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/stretchr/testify/require"
)

// Command is how the figures in results.json were produced, and GoCommand
// what it runs.
const (
	Command   = "make bench"
	GoCommand = "go test -tags bench -count=1 -timeout 15m -v ./bench"
)

// Files the run writes, relative to this package's directory (go test runs
// in it).
const (
	resultsFile    = "results.json"
	benchmarksFile = "../BENCHMARKS.md"
	beginMarker    = "<!-- bench:results:begin (written by make bench; edit the prose around it, not this table) -->"
	endMarker      = "<!-- bench:results:end -->"
)

// Figure is one measured number. A figure with a Baseline is compared with
// the baseline figure measured in the same run: Ratio is Value / the
// baseline's Value.
type Figure struct {
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	Baseline string  `json:"baseline,omitempty"`
	Ratio    float64 `json:"ratio,omitempty"`
	Samples  int     `json:"samples,omitempty"`
	// Repeats are the values of a figure measured several times in a row;
	// Value is their median.
	Repeats    []float64 `json:"repeats,omitempty"`
	What       string    `json:"what"`
	Test       string    `json:"test"`
	MeasuredAt time.Time `json:"measured_at"`
}

// Results is the content of results.json.
type Results struct {
	Command     string             `json:"command"`
	GoCommand   string             `json:"go_command"`
	GeneratedAt time.Time          `json:"generated_at"`
	Host        map[string]string  `json:"host"`
	Figures     map[string]*Figure `json:"figures"`
	// Order lists the figure names in the order they were measured.
	Order []string `json:"order"`
}

var (
	resultsMu sync.Mutex
	measured  = map[string]*Figure{}
	order     []string
	hostInfo  = map[string]string{}
)

// record stores a figure measured by t.
func record(t *testing.T, name string, f Figure) {
	t.Helper()
	f.Test = t.Name()
	f.MeasuredAt = time.Now().UTC()
	resultsMu.Lock()
	defer resultsMu.Unlock()
	if _, ok := measured[name]; !ok {
		order = append(order, name)
	}
	measured[name] = &f
	t.Logf("%-34s %12.3f %s", name, f.Value, f.Unit)
}

func TestMain(m *testing.M) {
	hostInfo["cpus"] = fmt.Sprint(runtime.NumCPU())
	hostInfo["go"] = runtime.Version()
	hostInfo["os"] = runtime.GOOS + "/" + runtime.GOARCH
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		hostInfo["loadavg_at_start"] = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		hostInfo["kernel"] = strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("docker", "version", "--format", "{{.Server.Version}} (API {{.Server.APIVersion}})").Output(); err == nil {
		hostInfo["docker"] = strings.TrimSpace(string(out))
	}
	hostInfo["nats_server"] = "v2.15.2 (embedded, file storage under the test's temp dir)"
	code := m.Run()
	if len(measured) > 0 {
		if b, err := os.ReadFile("/proc/loadavg"); err == nil {
			hostInfo["loadavg_at_end"] = strings.TrimSpace(string(b))
		}
		if err := writeResults(code == 0); err != nil {
			fmt.Fprintln(os.Stderr, "bench: write results:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// writeResults merges this run's figures into results.json (figures this
// run did not measure, with -run, keep their earlier values and dates),
// computes the ratios, and rewrites the results table in BENCHMARKS.md.
// A failed run writes nothing.
func writeResults(ok bool) error {
	if !ok {
		fmt.Fprintln(os.Stderr, "bench: a benchmark failed; results.json and BENCHMARKS.md left as they were")
		return nil
	}
	res := Results{Figures: map[string]*Figure{}}
	if b, err := os.ReadFile(resultsFile); err == nil {
		_ = json.Unmarshal(b, &res)
		if res.Figures == nil {
			res.Figures = map[string]*Figure{}
		}
	}
	res.Command, res.GoCommand = Command, GoCommand
	res.GeneratedAt = time.Now().UTC()
	res.Host = hostInfo
	for _, name := range order {
		res.Figures[name] = measured[name]
		if !slices.Contains(res.Order, name) {
			res.Order = append(res.Order, name)
		}
	}
	for _, f := range res.Figures {
		f.Ratio = 0
		if b, ok := res.Figures[f.Baseline]; ok && b.Value != 0 {
			f.Ratio = round(f.Value/b.Value, 4)
		}
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(resultsFile, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return writeTable(res)
}

// writeTable replaces the part of BENCHMARKS.md between the markers with a
// table of every figure.
func writeTable(res Results) error {
	var tb strings.Builder
	fmt.Fprintf(&tb, "%s\n\n", beginMarker)
	fmt.Fprintf(&tb, "Generated %s by `%s` (`%s`); the same figures, with their dates, are in [bench/results.json](bench/results.json).\n", res.GeneratedAt.Format(time.RFC3339), Command, GoCommand)
	var keys []string
	for k := range res.Host {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	tb.WriteString("Host:")
	for i, k := range keys {
		sep := ";"
		if i == len(keys)-1 {
			sep = "."
		}
		fmt.Fprintf(&tb, " %s %s%s", k, res.Host[k], sep)
	}
	tb.WriteString("\n\n| Figure | Value | Baseline | Baseline value | Ratio | n | What |\n| --- | ---: | --- | ---: | ---: | ---: | --- |\n")
	for _, name := range res.Order {
		f, ok := res.Figures[name]
		if !ok {
			continue
		}
		base, bval, ratio := "", "", ""
		if b, ok := res.Figures[f.Baseline]; ok {
			base, bval = "`"+f.Baseline+"`", fmtValue(b.Value, b.Unit)
			ratio = fmt.Sprintf("%.3g×", f.Ratio)
		}
		n := ""
		if f.Samples > 0 {
			n = fmt.Sprint(f.Samples)
		}
		value := fmtValue(f.Value, f.Unit)
		if len(f.Repeats) > 1 {
			var rs []string
			for _, r := range f.Repeats {
				rs = append(rs, fmtValue(r, ""))
			}
			value += " (median of " + strings.Join(rs, ", ") + ")"
		}
		fmt.Fprintf(&tb, "| `%s` | %s | %s | %s | %s | %s | %s |\n", name, value, base, bval, ratio, n, f.What)
	}
	fmt.Fprintf(&tb, "\n%s", endMarker)

	old, err := os.ReadFile(benchmarksFile)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	doc := string(old)
	i, j := strings.Index(doc, beginMarker), strings.Index(doc, endMarker)
	switch {
	case i >= 0 && j > i:
		doc = doc[:i] + tb.String() + doc[j+len(endMarker):]
	default:
		doc = strings.TrimRight(doc, "\n") + "\n\n## Results\n\n" + tb.String() + "\n"
	}
	return os.WriteFile(benchmarksFile, []byte(doc), 0o644)
}

func fmtValue(v float64, unit string) string {
	var s string
	switch {
	case v >= 100:
		s = fmt.Sprintf("%.0f", v)
	case v >= 10:
		s = fmt.Sprintf("%.1f", v)
	default:
		s = fmt.Sprintf("%.3g", v)
	}
	if unit != "" {
		s += " " + unit
	}
	return s
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// percentile returns the q-quantile (0..1) of xs by the nearest-rank
// method: with 30 samples, p99 is the largest.
func percentile(xs []float64, q float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return math.NaN()
	}
	k := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(k, len(s)-1))]
}

func median(xs []float64) float64 { return percentile(xs, 0.5) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// binary returns the absolute path of bin/<name>, built by `make build`.
func binary(t testing.TB, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "bin", name))
	require.NoError(t, err)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is missing: run `make build` (make bench does)", p)
	}
	return p
}

// profiles loads a profile file adding "nocoord" (the built-in shell profile
// with coordination off) to the built-in "shell" (coordination on).
func profiles(t testing.TB) profile.Profiles {
	t.Helper()
	path := filepath.Join(t.TempDir(), "profiles.toml")
	require.NoError(t, os.WriteFile(path, []byte(`[profiles.nocoord]
image        = "jetcrew-sandbox:latest"
command      = ["/bin/sh", "-c", "{prompt}"]
coordination = false
`), 0o644))
	ps, err := profile.LoadProfiles(path)
	require.NoError(t, err)
	return ps
}

// dockerClient connects to the engine as the worker's runtime does.
func dockerClient(t testing.TB) *client.Client {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = cli.Ping(ctx)
	require.NoError(t, err, "the Docker engine must be reachable")
	_, err = cli.ImageInspect(ctx, "jetcrew-sandbox:latest")
	require.NoError(t, err, "jetcrew-sandbox:latest must exist: run `make images` (make bench does)")
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// vmRSS returns a process's resident set size in KiB, from
// /proc/<pid>/status.
func vmRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			var kib int64
			if _, err := fmt.Sscanf(strings.TrimSpace(string(v)), "%d kB", &kib); err != nil {
				return 0, fmt.Errorf("parse VmRSS %q: %w", v, err)
			}
			return kib, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}
