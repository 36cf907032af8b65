package runner

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a worker's Prometheus metrics. Each Worker has its own set on
// its own registry (Worker.Registry), so several workers in one process (as
// in tests) never collide.
type Metrics struct {
	started     prometheus.Counter
	finished    *prometheus.CounterVec
	duration    prometheus.Histogram
	queueWait   prometheus.Histogram
	inFlight    prometheus.Gauge
	redelivered prometheus.Counter
	coordMsgs   *prometheus.CounterVec
}

// NewMetrics returns the run metrics of worker workerID of pool,
// registered on reg.
func NewMetrics(reg prometheus.Registerer, workerID, pool string) *Metrics {
	labels := prometheus.Labels{"worker": workerID, "pool": pool}
	f := func(opts prometheus.Opts) prometheus.Opts {
		opts.Namespace = "jetcrew"
		opts.ConstLabels = labels
		return opts
	}
	m := &Metrics{
		started: prometheus.NewCounter(prometheus.CounterOpts(f(prometheus.Opts{
			Name: "runs_started_total", Help: "Containers started for runs."}))),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts(f(prometheus.Opts{
			Name: "runs_finished_total", Help: "Runs that reached a final state, by state."})), []string{"state"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "jetcrew", ConstLabels: labels,
			Name: "run_duration_seconds", Help: "From container start to final state, in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 16)}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "jetcrew", ConstLabels: labels,
			Name: "queue_wait_seconds", Help: "From the request's publish to its container start, in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 18)}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts(f(prometheus.Opts{
			Name: "runs_in_flight", Help: "Runs this worker holds now."}))),
		redelivered: prometheus.NewCounter(prometheus.CounterOpts(f(prometheus.Opts{
			Name: "redeliveries_total", Help: "Requests received on a delivery after the first."}))),
		coordMsgs: prometheus.NewCounterVec(prometheus.CounterOpts(f(prometheus.Opts{
			Name: "coordination_messages_total", Help: "Coordination messages relayed for runs, by direction."})), []string{"direction"}),
	}
	reg.MustRegister(m.started, m.finished, m.duration, m.queueWait, m.inFlight, m.redelivered, m.coordMsgs)
	return m
}
