package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/messages"
)

// Egress wiring inside a run container of a profile with an egress
// allowlist. The container's network is "none"; the launcher starts the
// egress relay on EgressProxyAddr, which joins each connection to the run's
// egress proxy over EgressSocketPath.
const (
	// EgressProxyAddr is where the run's HTTP clients find their proxy.
	EgressProxyAddr = "127.0.0.1:3128"
	// EgressSocketName is the egress proxy's socket in the run's directory.
	EgressSocketName = "egress.sock"
	// EgressSocketPath is that socket inside the container.
	EgressSocketPath = coordination.ContainerRunDir + "/" + EgressSocketName
)

// egressEnv returns the environment that points a run's HTTP clients at its
// egress proxy: HTTPS_PROXY, HTTP_PROXY, ALL_PROXY and their lowercase forms,
// NO_PROXY for loopback, and NODE_USE_ENV_PROXY=1, without which Node's
// built-in fetch (Node 24 and later) ignores them.
func egressEnv() []string {
	u := "http://" + EgressProxyAddr
	var env []string
	for _, k := range []string{"HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"} {
		env = append(env, k+"="+u, strings.ToLower(k)+"="+u)
	}
	return append(env, "NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1", "NODE_USE_ENV_PROXY=1")
}

// CA files staged in the run directory of a profile with egress_inject.
const (
	// EgressCAName is the installation's egress CA certificate alone.
	EgressCAName = "egress-ca.pem"
	// EgressCABundleName is the worker host's CA bundle plus the egress CA.
	EgressCABundleName = "ca-bundle.pem"
)

// egressTrustEnv points the run's TLS clients at the staged CA files:
// SSL_CERT_FILE (OpenSSL, Go), REQUESTS_CA_BUNDLE (Python requests),
// CURL_CA_BUNDLE (curl) name the bundle; NODE_EXTRA_CA_CERTS (Node) adds the
// CA to Node's own roots.
func egressTrustEnv() []string {
	bundle := coordination.ContainerRunDir + "/" + EgressCABundleName
	return []string{"SSL_CERT_FILE=" + bundle, "REQUESTS_CA_BUNDLE=" + bundle, "CURL_CA_BUNDLE=" + bundle,
		"NODE_EXTRA_CA_CERTS=" + coordination.ContainerRunDir + "/" + EgressCAName}
}

// egressState is the worker's egress machinery: the proxy configuration
// shared by the runs' sessions, and the start-up proof's outcome.
type egressState struct {
	cfg egress.Config
	// caPEM is the egress CA's certificate, for profiles with
	// egress_inject; nil when none has.
	caPEM []byte
	// proved is closed when the proof has an outcome; err is its failure.
	proved chan struct{}
	err    error
	once   sync.Once
}

// hasEgressProfiles reports whether any profile has an egress allowlist.
func (w *Worker) hasEgressProfiles() bool {
	for _, p := range w.cfg.Profiles {
		if len(p.Egress) > 0 {
			return true
		}
	}
	return false
}

// startEgress sets up the egress proxy configuration and, when a profile
// has an allowlist, starts the start-up proof in the background (it ends
// with ctx). Called by Start.
func (w *Worker) startEgress(ctx context.Context) {
	w.egress = &egressState{proved: make(chan struct{})}
	attempts := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "jetcrew",
		ConstLabels: prometheus.Labels{"worker": w.cfg.ID, "pool": w.cfg.Pool},
		Name:        "egress_attempts_total", Help: "Connection attempts of runs through their egress proxy, by result (allowed, refused)."},
		[]string{"result"})
	w.reg.MustRegister(attempts)
	observe := func(allowed bool) {
		if allowed {
			attempts.WithLabelValues("allowed").Inc()
		} else {
			attempts.WithLabelValues("refused").Inc()
		}
	}
	w.egress.cfg = egress.Config{Resolver: w.cfg.EgressResolver, Logger: w.log, Publish: w.publishEgress, Observe: observe,
		RestartDelay: w.cfg.EgressRestartDelay, UpstreamRoots: w.cfg.EgressUpstreamRoots}
	if !w.hasEgressProfiles() {
		w.egress.settle(nil)
		return
	}
	if err := w.loadEgressCA(); err != nil {
		w.log.Error().Err(err).Msg("egress CA: runs of profiles with an egress allowlist are refused")
		w.egress.settle(err)
		return
	}
	w.bg.Add(1)
	go func() {
		defer w.bg.Done()
		err := w.proveEgress(ctx)
		if err != nil {
			w.log.Error().Err(err).Msg("egress proof failed: runs of profiles with an egress allowlist are refused")
		} else {
			w.log.Info().Msg("egress proof passed: the jail reaches its proxy and nothing else")
		}
		w.egress.settle(err)
	}()
}

func (e *egressState) settle(err error) {
	e.once.Do(func() { e.err = err; close(e.proved) })
}

// egressReady reports whether the start-up proof passed (or none is
// needed): part of Ready.
func (w *Worker) egressReady() bool {
	if w.egress == nil {
		return false
	}
	select {
	case <-w.egress.proved:
		return w.egress.err == nil
	default:
		return false
	}
}

// awaitEgressProof waits for the start-up proof and returns its failure.
func (w *Worker) awaitEgressProof(ctx context.Context) error {
	select {
	case <-w.egress.proved:
	case <-ctx.Done():
		return ctx.Err()
	}
	if w.egress.err != nil {
		return fmt.Errorf("egress refused: the worker's egress proof failed, so no run of an egress profile runs here: %w", w.egress.err)
	}
	return nil
}

// publishEgress publishes an egress attempt on
// jetcrew.events.<run_id>.egress: a core publish, captured by the events
// stream, so a slow server never holds up the proxy.
func (w *Worker) publishEgress(ev messages.EgressEvent) {
	b, err := json.Marshal(ev)
	if err != nil {
		return
	}
	m := nats.NewMsg(messages.SubjectEvents(ev.RunID, messages.EventEgress))
	m.Data = b
	m.Header.Set(messages.HeaderRunID, ev.RunID)
	if err := w.nc.PublishMsg(m); err != nil {
		w.log.Warn().Err(err).Str("run_id", ev.RunID).Msg("publish egress event")
	}
}

// openEgress starts the egress proxy of a run of profile prof on the
// socket in the run's directory dir, once the worker's proof passed. It
// returns nil and no error for a profile without egress.
func (r *run) openEgress(ctx context.Context, prof Profile, dir string) error {
	if len(prof.Egress) == 0 {
		return nil
	}
	if r.cs != nil {
		r.cs.onlyMCP = false // the socket and CA staged here: never pooled
	}
	if err := r.w.awaitEgressProof(ctx); err != nil {
		return err
	}
	inj, err := r.w.injections(prof)
	if err != nil {
		return err
	}
	if len(inj) > 0 {
		if err := r.w.stageEgressCA(dir); err != nil {
			return err
		}
	}
	s, err := egress.Open(r.w.egress.cfg, r.req.ID, prof.egressPolicy, filepath.Join(dir, EgressSocketName), inj...)
	if err != nil {
		return err
	}
	r.egressSess = s
	r.state.Egress = &messages.EgressTotals{}
	return nil
}

// KillEgress cuts the egress proxy of run runID as a crash would: its
// listener and every open connection. Its supervisor reopens it after
// Config.EgressRestartDelay; meanwhile the run's connections fail (the
// container has no other way out). It reports whether the run is active
// here with an egress proxy. For drills and tests.
func (w *Worker) KillEgress(runID string) bool {
	w.mu.Lock()
	a := w.active[runID]
	w.mu.Unlock()
	if a == nil || a.run.egressSess == nil {
		return false
	}
	a.run.egressSess.Kill()
	return true
}

// noteEgress closes the run's egress proxy (the run's container has ended
// when its final state is recorded) and copies its final totals into the
// state.
func (r *run) noteEgress() {
	if r.egressSess != nil {
		t := r.egressSess.Close()
		r.state.Egress = &t
	}
}

// closeEgress stops the run's egress proxy (every open tunnel is cut).
func (r *run) closeEgress() {
	if r.egressSess != nil {
		r.egressSess.Close()
	}
}

// errNoDocker is the proof's failure when the runtime cannot run it.
var errNoDocker = errors.New("the runtime could not start the proof container")

// probeTargets returns the addresses the proof container must not reach
// directly: the configured outside address, the metadata address, and each
// of the host's IPv4 addresses on each of the host's service ports.
func (w *Worker) probeTargets() []string {
	targets := []string{w.cfg.EgressProbeOutside, "169.254.169.254:80"}
	as, _ := net.InterfaceAddrs()
	for _, a := range as {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.To4() == nil {
			continue
		}
		for _, p := range w.cfg.EgressProbePorts {
			targets = append(targets, net.JoinHostPort(ipn.IP.String(), fmt.Sprint(p)))
		}
	}
	return targets
}

// forbiddenInjectHeaders may not be set by an injection: they frame the
// request or steer the proxy.
var forbiddenInjectHeaders = []string{"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer", "proxy-authorization", "proxy-connection"}

// validateInject checks the profile's egress_inject entries: each names an
// exact (not wildcard) egress entry, a header that does not frame the
// request, and a variable that is not also passed into the container.
func (p Profile) validateInject() error {
	for _, in := range p.EgressInject {
		host, _, err := net.SplitHostPort(in.Host)
		if err != nil || strings.HasPrefix(host, "*") || !slices.ContainsFunc(p.Egress, func(e string) bool { return strings.EqualFold(e, in.Host) }) {
			return fmt.Errorf("egress_inject host %q must be one of the profile's egress entries, a name:port without wildcard", in.Host)
		}
		if !validHeaderName(in.Header) || slices.Contains(forbiddenInjectHeaders, strings.ToLower(in.Header)) {
			return fmt.Errorf("egress_inject header %q is not a header the proxy may set", in.Header)
		}
		if !messages.ValidEnvName(in.FromEnv) {
			return fmt.Errorf("egress_inject from_env %q is not a valid variable name", in.FromEnv)
		}
		if slices.Contains(p.EnvFromHost, in.FromEnv) {
			return fmt.Errorf("egress_inject from_env %s is also in env_from_host, which would put the key into the container", in.FromEnv)
		}
	}
	return nil
}

// validHeaderName reports whether s is an HTTP header name (an RFC 9110
// token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", c)) {
			return false
		}
	}
	return true
}
