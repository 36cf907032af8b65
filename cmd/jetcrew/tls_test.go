package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/roles"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// writeCerts makes a CA and a server certificate for 127.0.0.1 signed by
// it, and returns the PEM files: ca, cert, key.
func writeCerts(t *testing.T) (ca, cert, key string) {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "jetcrew test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	require.NoError(t, err)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server-key.pem", "EC PRIVATE KEY", keyDER)
}

// `up --tlscert --tlskey` serves TLS only: a plain client is refused, the
// CLI with --tlsca works.
func TestUpTLS(t *testing.T) {
	t.Parallel()
	ca, cert, key := writeCerts(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	up := newTestApp(nil, workertest.NewTestRuntime(t))
	done := make(chan int, 1)
	go func() {
		done <- up.run(ctx, []string{"up", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--tlscert", cert, "--tlskey", key})
	}()
	var url string
	require.Eventually(t, func() bool {
		m := regexp.MustCompile(`(?m)^NATS_URL=(tls://127\.0\.0\.1:\d+)$`).FindStringSubmatch(up.stdout.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	}, 15*time.Second, 20*time.Millisecond, "stderr: %s", up.stderr.String())
	plain := "nats" + url[len("tls"):]

	code, _, errOut := cli(t, plain, "status", "x")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "connect to NATS")
	code, _, errOut = cli(t, url, "status", "x")
	require.Equal(t, 1, code, "a server certificate no CA vouches for: %s", errOut)
	require.Contains(t, errOut, "certificate")

	code, out, errOut := cli(t, plain, "submit", "--tlsca", ca, "--wait", "out over tls")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "over tls\n", out)
	a := newTestApp(map[string]string{"NATS_URL": url, "NATS_CA": ca}, nil)
	require.Equal(t, 0, a.run(t.Context(), []string{"submit", "--wait", "out env"}), a.stderr.String())

	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code, up.stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatal("up did not stop")
	}
}

// natsCLI returns the stock NATS CLI, which `make tools` installs; a test
// needing it fails without it.
func natsCLI(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("nats"); err == nil {
		return p
	}
	home, err := os.UserHomeDir()
	require.NoError(t, err)
	p := filepath.Join(home, "go", "bin", "nats")
	_, err = os.Stat(p)
	require.NoError(t, err, "the NATS CLI is not installed (make tools: go install github.com/nats-io/natscli/nats@v0.5.0)")
	return p
}

// A context made by the stock `nats context save` works with `jetcrew
// --context`, by name and as a file.
func TestNATSContextSave(t *testing.T) {
	t.Parallel()
	e := authUp(t)
	xdg := t.TempDir()
	seed := filepath.Join(e.data, authDirName, string(roles.Submitter)+".nk")
	save := exec.Command(natsCLI(t), "context", "save", "mine", "--server", e.url, "--nkey", seed, "--inbox-prefix", roles.InboxPrefix(roles.Submitter))
	save.Env = append(os.Environ(), "XDG_CONFIG_HOME="+xdg, "HOME="+t.TempDir())
	out, err := save.CombinedOutput()
	require.NoError(t, err, "%s", out)

	// The stock CLI itself submits with it: a plain publish.
	pub := exec.Command(natsCLI(t), "--context", "mine", "pub", "jetcrew.runs.default", `{"id":"by-nats","profile":"shell","prompt":"out hi"}`)
	pub.Env = save.Env
	out, err = pub.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NotContains(t, string(out), "Permissions Violation")

	a := newTestApp(map[string]string{"XDG_CONFIG_HOME": xdg}, nil)
	require.Equal(t, 0, a.run(t.Context(), []string{"--context", "mine", "submit", "--wait", "out via context"}), a.stderr.String())
	require.Equal(t, "via context\n", a.stdout.String())
	a = newTestApp(map[string]string{"XDG_CONFIG_HOME": xdg, "NATS_CONTEXT": "mine"}, nil)
	require.Equal(t, 0, a.run(t.Context(), []string{"watch", "by-nats"}), a.stderr.String())
	require.Equal(t, "hi\n", a.stdout.String())

	file := filepath.Join(xdg, "nats", "context", "mine.json")
	a = newTestApp(nil, nil)
	require.Equal(t, 0, a.run(t.Context(), []string{"--context", file, "submit", "--wait", "out via file"}), a.stderr.String())

	// The contexts `up --auth` wrote work with the stock CLI as they are.
	pub = exec.Command(natsCLI(t), "--context", "jetcrew-submitter", "pub", "jetcrew.runs.default", `{"id":"by-up-context","profile":"shell","prompt":"out up"}`)
	pub.Env = append(os.Environ(), "XDG_CONFIG_HOME="+e.xdg, "HOME="+t.TempDir())
	out, err = pub.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NotContains(t, string(out), "Permissions Violation")
	code, stdout, errOut := e.as(t, roles.Operator, "watch", "by-up-context")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "up\n", stdout)
	deny := exec.Command(natsCLI(t), "--context", "jetcrew-observer", "pub", "jetcrew.runs.default", `{}`)
	deny.Env = pub.Env
	out, _ = deny.CombinedOutput()
	require.Contains(t, string(out), "Permissions Violation", "the observer may not submit")

	a = newTestApp(map[string]string{"XDG_CONFIG_HOME": xdg, "NATS_CONTEXT": "nope"}, nil)
	require.Equal(t, exitUsage, a.run(t.Context(), []string{"status", "x"}))
	require.Contains(t, a.stderr.String(), `NATS context "nope"`)
}
