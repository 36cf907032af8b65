package worker

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/jetcrew/jetcrew/egress"
)

// hostCABundles are where Linux distributions keep the system's CA bundle;
// the first that exists on the worker's host is copied into a run's
// ca-bundle.pem.
var hostCABundles = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"}

var hostBundle = sync.OnceValue(func() []byte {
	for _, p := range hostCABundles {
		if b, err := os.ReadFile(p); err == nil {
			return b
		}
	}
	return nil
})

// loadEgressCA loads (or makes) the installation's egress CA when a profile
// has egress_inject.
func (w *Worker) loadEgressCA() error {
	need := false
	for _, p := range w.cfg.Profiles {
		need = need || len(p.EgressInject) > 0
	}
	if !need {
		return nil
	}
	dir := w.cfg.EgressCADir
	if dir == "" {
		base, err := os.UserConfigDir()
		if err != nil {
			return fmt.Errorf("egress CA: no directory for it (set the worker's egress CA dir): %w", err)
		}
		dir = filepath.Join(base, "jetcrew", "egress-ca", w.install)
	}
	ca, certPEM, err := egress.LoadOrCreateCA(dir, "jetcrew egress CA "+w.install)
	if err != nil {
		return err
	}
	w.egress.cfg.CA, w.egress.caPEM = ca, certPEM
	w.log.Info().Str("dir", dir).Msg("egress CA loaded")
	return nil
}

// injections returns the egress proxy's header injections of a run of
// prof, their values read from the worker's environment. A variable that is
// not set fails the run (retrying cannot fix it).
func (w *Worker) injections(prof Profile) ([]egress.Injection, error) {
	var out []egress.Injection
	for _, in := range prof.EgressInject {
		v, ok := w.cfg.LookupEnv(in.FromEnv)
		if !ok {
			return nil, fmt.Errorf("profile %q: egress_inject from_env %s is not set in the worker's environment", prof.Name, in.FromEnv)
		}
		host, port, _ := net.SplitHostPort(in.Host)
		n, _ := strconv.Atoi(port)
		out = append(out, egress.Injection{Name: host, Port: n, Header: in.Header, Value: in.Prefix + v})
	}
	return out, nil
}

// stageEgressCA writes the egress CA's certificate (never its key) and the
// host's bundle plus that certificate into the run's directory, 0444.
func (w *Worker) stageEgressCA(dir string) error {
	bundle := append(append([]byte(nil), hostBundle()...), '\n')
	bundle = append(bundle, w.egress.caPEM...)
	for name, data := range map[string][]byte{EgressCAName: w.egress.caPEM, EgressCABundleName: bundle} {
		p := filepath.Join(dir, name)
		_ = os.Remove(p)
		if err := os.WriteFile(p, data, 0o444); err != nil {
			return fmt.Errorf("stage %s: %w", name, err)
		}
		// The worker's umask may have taken the run user's read bit.
		if err := os.Chmod(p, 0o444); err != nil {
			return fmt.Errorf("stage %s: %w", name, err)
		}
	}
	return nil
}
