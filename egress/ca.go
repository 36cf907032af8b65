package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// caFile is the file, in the directory LoadOrCreateCA keeps the CA in,
// holding its certificate and its private key (PEM, mode 0600).
const caFile = "ca.pem"

// LoadOrCreateCA returns the certificate authority kept in dir/ca.pem,
// creating it when there is none: an ECDSA P-256 key and a self-signed
// certificate named name, valid for 10 years, that may sign only
// end-entity certificates (MaxPathLen 0). dir is created 0700 and the file
// written 0600: only the worker's user reads it; it is never mounted into a
// container. Workers racing to create it agree: the file appears at once,
// whole (a hard link of a finished temporary file), and the loser loads the
// winner's. It returns the key pair and the certificate alone in PEM.
func LoadOrCreateCA(dir, name string) (*tls.Certificate, []byte, error) {
	path := filepath.Join(dir, caFile)
	if pair, certPEM, err := loadCA(path); err == nil || !errors.Is(err, os.ErrNotExist) {
		return pair, certPEM, err
	}
	certPEM, keyPEM, err := newCA(name)
	if err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("egress CA: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".ca-*.pem")
	if err != nil {
		return nil, nil, fmt.Errorf("egress CA: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.Write(append(certPEM, keyPEM...))
	if cerr := tmp.Close(); werr != nil || cerr != nil {
		return nil, nil, fmt.Errorf("egress CA: %w", errors.Join(werr, cerr))
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, nil, fmt.Errorf("egress CA: %w", err)
	}
	return loadCA(path)
}

// loadCA reads the CA file at path.
func loadCA(path string) (*tls.Certificate, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	pair, err := tls.X509KeyPair(data, data)
	if err != nil {
		return nil, nil, fmt.Errorf("egress CA %s: %w", path, err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pair.Certificate[0]})
	return &pair, certPEM, nil
}

// newCA makes a CA key and self-signed certificate, in PEM.
func newCA(name string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"jetcrew"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}
