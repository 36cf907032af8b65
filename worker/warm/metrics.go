package warm

import "github.com/prometheus/client_golang/prometheus"

// metrics are the pool's Prometheus metrics.
type metrics struct {
	claimed  *prometheus.CounterVec
	missed   *prometheus.CounterVec
	replaced *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, workerID, pool string, p *Pool) metrics {
	labels := prometheus.Labels{"worker": workerID, "pool": pool}
	counter := func(name, help string, by ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "jetcrew", Subsystem: "warm", Name: name, Help: help, ConstLabels: labels}, by)
	}
	m := metrics{
		claimed:  counter("claimed_total", "Runs that started in a warm container, by profile.", "profile"),
		missed:   counter("missed_total", "Runs of a profile that keeps warm containers that started cold: none was ready, or the one claimed could not have the run (GaveBack), by profile.", "profile"),
		replaced: counter("replaced_total", "Warm containers removed unused and replaced, by profile and reason (exited, idle, image, mismatch, profile, unresponsive).", "profile", "reason"),
	}
	ready := readyCollector{p: p, desc: prometheus.NewDesc("jetcrew_warm_ready", "Warm containers ready now, by profile.", []string{"profile"}, labels)}
	reg.MustRegister(m.claimed, m.missed, m.replaced, ready)
	return m
}

// readyCollector reports each profile's ready warm containers at scrape
// time.
type readyCollector struct {
	p    *Pool
	desc *prometheus.Desc
}

func (r readyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- r.desc }

func (r readyCollector) Collect(ch chan<- prometheus.Metric) {
	var names []string
	ready := map[string]int{} // by profile: both its pools
	for _, st := range r.p.Status() {
		if _, ok := ready[st.Profile]; !ok {
			names = append(names, st.Profile)
		}
		ready[st.Profile] += st.Ready
	}
	for _, name := range names {
		ch <- prometheus.MustNewConstMetric(r.desc, prometheus.GaugeValue, float64(ready[name]), name)
	}
}
