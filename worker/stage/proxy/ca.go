package proxy

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/worker/profile"
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

// loadCA loads (or makes) the installation's egress CA when a profile has
// egress_inject.
func (p *Proxies) loadCA() error {
	need := false
	for _, p := range p.cfg.Profiles.Load() {
		need = need || len(p.EgressInject) > 0
	}
	if !need {
		return nil
	}
	dir := p.cfg.CADir
	if dir == "" {
		base, err := os.UserConfigDir()
		if err != nil {
			return fmt.Errorf("egress CA: no directory for it (set the worker's egress CA dir): %w", err)
		}
		dir = filepath.Join(base, "jetcrew", "egress-ca", p.cfg.Install)
	}
	ca, certPEM, err := egress.LoadOrCreateCA(dir, "jetcrew egress CA "+p.cfg.Install)
	if err != nil {
		return err
	}
	p.ecfg.CA, p.caPEM, p.caDir = ca, certPEM, dir
	p.cfg.Log.Info().Str("dir", dir).Msg("egress CA loaded")
	return nil
}

// injections returns the egress proxy's header injections of a run of
// prof, their values read from the worker's environment. A variable that is
// not set fails the run (retrying cannot fix it).
func (p *Proxies) injections(prof *profile.Profile) ([]egress.Injection, error) {
	var out []egress.Injection
	for _, in := range prof.EgressInject {
		v, ok := p.cfg.LookupEnv(in.FromEnv)
		if !ok {
			return nil, fmt.Errorf("profile %q: egress_inject from_env %s is not set in the worker's environment", prof.Name, in.FromEnv)
		}
		host, port, _ := net.SplitHostPort(in.Host)
		n, _ := strconv.Atoi(port)
		out = append(out, egress.Injection{Name: host, Port: n, Header: in.Header, Value: in.Prefix + v})
	}
	return out, nil
}

// stageCA writes the egress CA's certificate (never its key) and the
// host's bundle plus that certificate into the run's directory, 0444.
func (p *Proxies) stageCA(dir string) error {
	bundle := append(append([]byte(nil), hostBundle()...), '\n')
	bundle = append(bundle, p.caPEM...)
	for name, data := range map[string][]byte{profile.EgressCAName: p.caPEM, profile.EgressCABundleName: bundle} {
		path := filepath.Join(dir, name)
		_ = os.Remove(path)
		if err := os.WriteFile(path, data, 0o444); err != nil {
			return fmt.Errorf("stage %s: %w", name, err)
		}
		// The worker's umask may have taken the run user's read bit.
		if err := os.Chmod(path, 0o444); err != nil {
			return fmt.Errorf("stage %s: %w", name, err)
		}
	}
	return nil
}

// errNoDocker is the proof's failure when the runtime cannot run it.
var errNoDocker = errors.New("the runtime could not start the proof container")

// probeTargets returns the addresses the proof container must not reach
// directly: the configured outside address, the metadata address, and each
// of the host's IPv4 addresses on each of the host's service ports.
func (p *Proxies) probeTargets() []string {
	targets := []string{p.cfg.Proof.Outside, "169.254.169.254:80"}
	as, _ := net.InterfaceAddrs()
	for _, a := range as {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.To4() == nil {
			continue
		}
		for _, port := range p.cfg.Proof.Ports {
			targets = append(targets, net.JoinHostPort(ipn.IP.String(), fmt.Sprint(port)))
		}
	}
	return targets
}
