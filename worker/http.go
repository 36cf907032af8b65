package worker

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler returns the worker's HTTP handler: GET /metrics (Prometheus text
// format, the metrics listed at Registry), /healthz (200 while the process
// serves HTTP: liveness) and /readyz (200 when Ready, else 503: readiness,
// for load balancers and orchestrators).
func (w *Worker) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(w.reg, promhttp.HandlerOpts{Registry: w.reg}))
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = rw.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !w.Ready() {
			rw.WriteHeader(http.StatusServiceUnavailable)
			_, _ = rw.Write([]byte("not ready\n"))
			return
		}
		_, _ = rw.Write([]byte("ready\n"))
	})
	return mux
}
