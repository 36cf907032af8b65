package egress

import (
	"crypto/x509"
	"fmt"
	"os"
)

// UpstreamRoots returns the roots that verify metered hosts' certificates,
// for Config.UpstreamRoots: the system's (x509.SystemCertPool: the host's
// CA bundle, or SSL_CERT_FILE and SSL_CERT_DIR when set) plus every
// certificate in the PEM files, such as an operator's own CA in front of a
// provider (the worker's --egress-ca). With no file it returns nil: the
// system's roots alone. A file that cannot be read, or holds no PEM
// certificate, is an error naming it.
func UpstreamRoots(files ...string) (*x509.CertPool, error) {
	if len(files) == 0 {
		return nil, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool() // no system roots here: the files' alone
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("egress CA: %w", err)
		}
		if !pool.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("egress CA %s: no PEM certificate in it", f)
		}
	}
	return pool, nil
}
