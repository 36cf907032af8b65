package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/jetcrew/jetcrew/worker"
)

// metricsShutdownTimeout bounds the graceful shutdown of the metrics server:
// a scrape in progress gets this long to finish.
const metricsShutdownTimeout = 5 * time.Second

// maxReplicas is the most replicas a JetStream stream may have.
const maxReplicas = 5

// addMetricsFlag adds --metrics-addr (up and worker).
func (o *workerOptions) addMetricsFlag(fs *pflag.FlagSet) {
	fs.StringVar(&o.metricsAddr, "metrics-addr", "",
		"host:port to serve /metrics (Prometheus), /healthz and /readyz on, e.g. 127.0.0.1:9464; port 0 picks a free one (default: off)")
}

// addReplicasFlag adds --replicas (worker only: up runs one server).
func (o *workerOptions) addReplicasFlag(fs *pflag.FlagSet) {
	fs.IntVar(&o.replicas, "replicas", 1,
		"replicas of jetcrew's streams, buckets and pool consumer, set when the worker creates or updates them: 1 on one server, 3 on a JetStream cluster (every worker must use the same)")
}

// checkScaleOut validates --metrics-addr and --replicas: a mistake is a
// usage error, found before anything starts.
func (o *workerOptions) checkScaleOut() error {
	if o.metricsAddr != "" {
		_, port, err := net.SplitHostPort(o.metricsAddr)
		if err != nil {
			return usageError(fmt.Errorf("--metrics-addr %q: %w", o.metricsAddr, err))
		}
		if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			return usageError(fmt.Errorf("--metrics-addr %q: port must be a number from 0 to 65535", o.metricsAddr))
		}
	}
	// 0 is the zero value `up` leaves: one replica.
	if o.replicas < 0 || o.replicas > maxReplicas {
		return usageError(fmt.Errorf("--replicas %d: must be from 1 to %d", o.replicas, maxReplicas))
	}
	return nil
}

// serveMetrics serves w's HTTP handler (GET /metrics, /healthz, /readyz; see
// worker.Handler) on addr, with the Go runtime and process collectors added
// to the worker's registry (go_*, process_*: process_resident_memory_bytes
// among them). It listens before returning, so a bad or busy address fails
// here, before the worker takes runs; the server then runs on its own
// goroutine until the returned stop function shuts it down gracefully
// (scrapes in flight get metricsShutdownTimeout) and waits for it. An empty
// addr serves nothing and returns a no-op stop.
func (a workerCmds) serveMetrics(addr string, w *worker.Worker) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics server (--metrics-addr): %w", err)
	}
	log := a.log.With().Str("component", "metrics").Logger()
	registerRuntimeCollectors(w.Registry(), log)
	srv := &http.Server{
		Handler:           w.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          newHTTPErrorLog(log),
	}
	done := make(chan struct{})
	go func() {
		// Ends when stop calls Shutdown (or Close).
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("metrics server failed")
		}
	}()
	log.Info().Str("addr", ln.Addr().String()).Msg("serving /metrics, /healthz and /readyz")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), metricsShutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			log.Warn().Err(err).Msg("metrics server: graceful shutdown cut short")
			_ = srv.Close()
		}
		<-done
	}, nil
}

// registerRuntimeCollectors adds the Go runtime and process collectors to
// reg. One already there is left as it is; one that cannot be added is
// logged and left out.
func registerRuntimeCollectors(reg prometheus.Registerer, log zerolog.Logger) {
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				log.Warn().Err(err).Msg("runtime metrics left out")
			}
		}
	}
}

// newHTTPErrorLog routes net/http's error log (bad requests, handler panics)
// through the app's logger at warn level, instead of bare lines on stderr.
func newHTTPErrorLog(l zerolog.Logger) *log.Logger {
	return log.New(httpLogWriter{l}, "", 0)
}

type httpLogWriter struct{ l zerolog.Logger }

func (w httpLogWriter) Write(p []byte) (int, error) {
	msg := string(p)
	if n := len(msg); n > 0 && msg[n-1] == '\n' {
		msg = msg[:n-1]
	}
	w.l.Warn().Msg(msg)
	return len(p), nil
}
