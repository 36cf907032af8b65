package console

import (
	"fmt"
	"math"
	"time"

	"github.com/jetcrew/jetcrew/messages"
)

// waitBounds are the upper bounds, in seconds, of the queue-wait histogram
// a trend keeps per time bucket: the workers' own
// (jetcrew_queue_wait_seconds, worker/runner/metrics.go: 5 ms doubling 18
// times, to about 11 min), and one more bucket above the last.
var waitBounds = func() [18]float64 {
	var b [18]float64
	for i := range b {
		b[i] = 0.005 * math.Pow(2, float64(i))
	}
	return b
}()

// trendSpec is one window of the overview's charts: n buckets of step,
// the last one holding now.
type trendSpec struct {
	id, title, per string
	step           time.Duration
	n              int
}

// trendSpecs are the overview's windows: the last hour per 5 minutes and
// the last day per hour.
var trendSpecs = []trendSpec{
	{id: "hour", title: "Last hour", per: "per 5 minutes", step: 5 * time.Minute, n: 12},
	{id: "day", title: "Last day", per: "per hour", step: time.Hour, n: 24},
}

// trendBucket is one time bucket of a trend.
type trendBucket struct {
	Start time.Time
	// Finished counts the runs whose (latest) final state was reached in
	// the bucket, Failed those of them that failed, timed out or stalled.
	Finished, Failed int
	// Waits is the histogram of the queue waits of the runs that started
	// in the bucket (waitBounds, then longer), Started their number.
	Waits   [len(waitBounds) + 1]int
	Started int
}

// trend is one window of the overview's charts, gathered from the run
// states of the cache: each run counts once, by its latest state (a
// replayed run at its latest attempt). Its size is fixed (spec.n buckets),
// whatever the number of runs.
type trend struct {
	spec    trendSpec
	end     time.Time // the end of the last bucket
	Buckets []trendBucket
}

func newTrend(spec trendSpec, now time.Time) *trend {
	end := now.Truncate(spec.step).Add(spec.step)
	t := &trend{spec: spec, end: end, Buckets: make([]trendBucket, spec.n)}
	for i := range t.Buckets {
		t.Buckets[i].Start = end.Add(-time.Duration(spec.n-i) * spec.step)
	}
	return t
}

// bucket returns the bucket holding at, or nil when at is outside the
// window.
func (t *trend) bucket(at time.Time) *trendBucket {
	if at.IsZero() || at.Before(t.Buckets[0].Start) {
		return nil
	}
	i := int(at.Sub(t.Buckets[0].Start) / t.spec.step)
	if i >= t.spec.n {
		return nil
	}
	return &t.Buckets[i]
}

// add counts st. It is O(1): the overview calls it for every run.
func (t *trend) add(st *messages.RunState) {
	if st.State.Final() {
		if b := t.bucket(st.FinishedAt); b != nil {
			b.Finished++
			if st.State.Unsuccessful() {
				b.Failed++
			}
		}
	}
	if st.StartedAt.IsZero() || st.QueuedAt.IsZero() {
		return
	}
	if b := t.bucket(st.StartedAt); b != nil {
		b.Started++
		b.Waits[waitIndex(st.StartedAt.Sub(st.QueuedAt).Seconds())]++
	}
}

// waitIndex is the histogram bucket of a wait of secs seconds.
func waitIndex(secs float64) int {
	for i, b := range waitBounds {
		if secs <= b {
			return i
		}
	}
	return len(waitBounds)
}

// quantile estimates the q quantile (0..1) of a histogram h of
// waitBounds, interpolating linearly inside the bucket it falls in, as
// Prometheus's histogram_quantile does; n is h's total. ok is false when
// h is empty; a quantile beyond the last bound is that bound (over says so).
func quantile(h *[len(waitBounds) + 1]int, n int, q float64) (secs float64, over, ok bool) {
	if n == 0 {
		return 0, false, false
	}
	rank := q * float64(n)
	seen := 0
	for i, c := range h {
		if c == 0 || float64(seen+c) < rank {
			seen += c
			continue
		}
		if i == len(waitBounds) {
			return waitBounds[len(waitBounds)-1], true, true
		}
		lo := 0.0
		if i > 0 {
			lo = waitBounds[i-1]
		}
		return lo + (waitBounds[i]-lo)*(rank-float64(seen))/float64(c), false, true
	}
	return waitBounds[len(waitBounds)-1], true, true
}

// waitText says a quantile: "1.9s", "> 10m55s", "-" when there is none.
func waitText(secs float64, over, ok bool) string {
	d := time.Duration(secs * float64(time.Second))
	switch {
	case !ok:
		return "-"
	case over:
		return "> " + shortDuration(d)
	case d >= time.Second && d < 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return shortDuration(d)
}

// chart is one small bar chart, drawn as inline SVG by the overview.
type chart struct {
	// ID prefixes the ids of its title and description.
	ID string
	// Title names it; Desc sums it up in words, for a screen reader and
	// as the caption.
	Title, Desc string
	// W and H are the SVG's view box.
	W, H int
	Bars []bar
}

// bar is one bar (or a bar's segment) of a chart, in view-box units.
type bar struct {
	X, Y, W, H float64
	// Class colours it (CSS: .bar, .bar-fail, .bar-wait).
	Class string
	// Label is its tooltip.
	Label string
}

// chartHeight is the view-box height of a chart; barPitch the width a
// bucket takes, of which barWidth is the bar.
const (
	chartHeight = 40
	barPitch    = 10
	barWidth    = 8
)

// trendView is one window of charts on the overview.
type trendView struct {
	ID, Title, Per string
	Runs, Waits    chart
}

// view draws t's two charts: the runs finished per bucket with their
// failures stacked in red, and each bucket's median queue wait with its
// p90 behind it.
func (t *trend) view() trendView {
	v := trendView{ID: t.spec.id, Title: t.spec.title, Per: t.spec.per}
	var (
		finished, failed, started int
		all                       [len(waitBounds) + 1]int
		maxRuns                   int
		maxWait                   float64
	)
	p := make([][2]float64, len(t.Buckets))
	for i := range t.Buckets {
		b := &t.Buckets[i]
		finished += b.Finished
		failed += b.Failed
		started += b.Started
		for j, c := range b.Waits {
			all[j] += c
		}
		maxRuns = max(maxRuns, b.Finished)
		p50, _, _ := quantile(&b.Waits, b.Started, 0.5)
		p90, _, _ := quantile(&b.Waits, b.Started, 0.9)
		p[i] = [2]float64{p50, p90}
		maxWait = max(maxWait, p90)
	}
	w := len(t.Buckets) * barPitch
	v.Runs = chart{ID: "chart-runs-" + t.spec.id, Title: fmt.Sprintf("Runs finished, %s, %s", lower(t.spec.title), t.spec.per), W: w, H: chartHeight,
		Desc: fmt.Sprintf("%d run(s) finished, %d of them failed, timed out or stalled", finished, failed)}
	v.Waits = chart{ID: "chart-wait-" + t.spec.id, Title: fmt.Sprintf("Queue wait, %s, %s", lower(t.spec.title), t.spec.per), W: w, H: chartHeight,
		Desc: fmt.Sprintf("%d run(s) started; queue wait p50 %s, p90 %s", started, waitText(quantile(&all, started, 0.5)), waitText(quantile(&all, started, 0.9)))}
	scale := func(n, top float64) float64 {
		if top <= 0 {
			return 0
		}
		return math.Round(n/top*chartHeight*100) / 100
	}
	for i := range t.Buckets {
		b := &t.Buckets[i]
		x := float64(i*barPitch + (barPitch-barWidth)/2)
		span := fmt.Sprintf("%s–%s UTC", b.Start.UTC().Format("15:04"), b.Start.Add(t.spec.step).UTC().Format("15:04"))
		if b.Finished > 0 {
			label := fmt.Sprintf("%s: %d finished, %d failed", span, b.Finished, b.Failed)
			ok := scale(float64(b.Finished-b.Failed), float64(maxRuns))
			bad := scale(float64(b.Failed), float64(maxRuns))
			if ok > 0 {
				v.Runs.Bars = append(v.Runs.Bars, bar{X: x, Y: math.Round((chartHeight-ok)*100) / 100, W: barWidth, H: ok, Class: "bar", Label: label})
			}
			if bad > 0 {
				v.Runs.Bars = append(v.Runs.Bars, bar{X: x, Y: max(math.Round((chartHeight-ok-bad)*100)/100, 0), W: barWidth, H: bad, Class: "bar-fail", Label: label})
			}
		}
		if b.Started > 0 {
			label := fmt.Sprintf("%s: %d started, queue wait p50 %s, p90 %s", span, b.Started,
				waitText(quantile(&b.Waits, b.Started, 0.5)), waitText(quantile(&b.Waits, b.Started, 0.9)))
			h90 := max(scale(p[i][1], maxWait), 1)
			h50 := max(scale(p[i][0], maxWait), 1)
			v.Waits.Bars = append(v.Waits.Bars,
				bar{X: x, Y: math.Round((chartHeight-h90)*100) / 100, W: barWidth, H: h90, Class: "bar-p90", Label: label},
				bar{X: x, Y: math.Round((chartHeight-h50)*100) / 100, W: barWidth, H: h50, Class: "bar-wait", Label: label})
		}
	}
	return v
}

// lower lowers the first letter of s ("Last hour" → "last hour").
func lower(s string) string {
	if s == "" || s[0] < 'A' || s[0] > 'Z' {
		return s
	}
	return string(s[0]+'a'-'A') + s[1:]
}
