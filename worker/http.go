package worker

import (
	"fmt"
	"io"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler returns the worker's HTTP handler: GET /metrics (Prometheus text
// format, the metrics listed at Registry), /healthz (200 while the process
// serves HTTP: liveness) and /readyz (200 when Ready, else 503: readiness,
// for load balancers and orchestrators; a ready worker adds a line per warm
// pool: its ready containers, and why the engine refuses to make more
// while it backs off — a run still starts cold then, so it is not a
// reason to be unready).
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
		w.writeWarmStatus(rw)
	})
	return mux
}

// writeWarmStatus writes a line per warm pool: "warm PROFILE: READY/TARGET
// ready" ("warm PROFILE+workspace: …" for its pool for workspace runs),
// and the pool's last failure while it backs off.
func (w *Worker) writeWarmStatus(out io.Writer) {
	for _, st := range w.warm.Status() {
		name := st.Profile
		if st.Workspace {
			name += "+workspace"
		}
		fmt.Fprintf(out, "warm %s: %d/%d ready", name, st.Ready, st.Target)
		if st.Error != "" {
			fmt.Fprintf(out, "; backing off: %s", st.Error)
		}
		fmt.Fprintln(out)
	}
}
