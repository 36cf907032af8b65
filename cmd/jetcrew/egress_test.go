package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// watch prints refused egress attempts, one line each, and nothing for
// allowed ones.
func TestWatchPrintsEgressRefusals(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	p := &runPrinter{stdout: &out, stderr: &errOut, atLineStart: true}
	for _, ev := range []messages.EgressEvent{
		{Method: "CONNECT", Host: "api.anthropic.com", Port: 443, Allowed: true, BytesDown: 10},
		{Method: "CONNECT", Host: "evil.example", Port: 443, Reason: "not in the profile's egress allowlist"},
		{Reason: "too many connections to the run's egress proxy (at most 64 at once)"},
	} {
		b, err := json.Marshal(ev)
		require.NoError(t, err)
		require.NoError(t, p.print(dispatcher.WatchEvent{Type: messages.EventEgress, Data: b}))
	}
	require.Empty(t, out.String())
	require.Equal(t, "--- egress refused: CONNECT evil.example:443: not in the profile's egress allowlist\n"+
		"--- egress refused: too many connections to the run's egress proxy (at most 64 at once)\n", errOut.String())
}

// A refused attempt's method and host are the run's choice: shown escaped,
// one line whatever they hold.
func TestEgressRefusalEscaped(t *testing.T) {
	t.Parallel()
	var errOut bytes.Buffer
	p := &runPrinter{stdout: &bytes.Buffer{}, stderr: &errOut, atLineStart: true}
	b, err := json.Marshal(messages.EgressEvent{Method: "CONNECT\x1b]0;t\a", Host: "moc.elpmaxe\u202e.evil\nforged", Port: 443, Reason: "not allowed\u009b"})
	require.NoError(t, err)
	require.NoError(t, p.print(dispatcher.WatchEvent{Type: messages.EventEgress, Data: b}))
	require.Equal(t, `--- egress refused: CONNECT\x1b]0;t\a moc.elpmaxe\u202e.evil\nforged:443: not allowed\u009b`+"\n", errOut.String())
}

// status shows a run's egress totals, and nothing about egress for a run
// without them.
func TestStatusShowsEgress(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	require.NoError(t, printState(&b, messages.RunState{ID: "r1", State: messages.StateSucceeded,
		Egress: &messages.EgressTotals{Allowed: 3, Refused: 1, BytesUp: 10, BytesDown: 20}}))
	require.Contains(t, b.String(), "3 allowed, 1 refused, 10 bytes up, 20 bytes down")
	b.Reset()
	require.NoError(t, printState(&b, messages.RunState{ID: "r1", State: messages.StateSucceeded}))
	require.NotContains(t, b.String(), "egress")
}

// watch (and submit --wait) prints an allowed attempt whose host could not
// be reached or did not answer, with its cause, one line each.
func TestWatchPrintsEgressUpstreamFailures(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	p := &runPrinter{stdout: &out, stderr: &errOut, atLineStart: true}
	require.NoError(t, p.print(dispatcher.WatchEvent{Type: messages.EventOutput, Stream: messages.StreamStdout, Data: []byte("partial")}))
	for _, ev := range []messages.EgressEvent{
		{Method: "POST", Host: "api.anthropic.com", Port: 443, Allowed: true, BytesDown: 10},
		{Method: "POST", Host: "api.anthropic.com", Port: 443, Allowed: true,
			Reason: "upstream certificate not trusted: x509: certificate signed by unknown authority"},
		{Method: "CONNECT", Host: "pypi.org", Port: 443, Allowed: true, Reason: "upstream refused the connection\x1b[2J"},
	} {
		b, err := json.Marshal(ev)
		require.NoError(t, err)
		require.NoError(t, p.print(dispatcher.WatchEvent{Type: messages.EventEgress, Data: b}))
	}
	require.Equal(t, "partial", out.String())
	require.Equal(t, "\n--- egress upstream failed: POST api.anthropic.com:443: upstream certificate not trusted: x509: certificate signed by unknown authority\n"+
		`--- egress upstream failed: CONNECT pypi.org:443: upstream refused the connection\x1b[2J`+"\n", errOut.String())
}

// status counts a run's upstream failures with its egress totals.
func TestStatusShowsUpstreamFailures(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	require.NoError(t, printState(&b, messages.RunState{ID: "r1", State: messages.StateSucceeded,
		Egress: &messages.EgressTotals{Allowed: 3, Refused: 1, BytesUp: 10, BytesDown: 20, UpstreamFailed: 2}}))
	require.Contains(t, b.String(), "3 allowed, 1 refused, 10 bytes up, 20 bytes down, 2 upstream failures")
}

// selfSignedPEM writes a new self-signed CA certificate named name to a
// PEM file and returns its path and the certificate.
func selfSignedPEM(t *testing.T, name string) (string, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), name+".pem")
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644))
	return path, cert
}

// --egress-ca FILE (repeatable, on worker and up) adds each file's CA to
// the roots the egress proxy verifies metered hosts with; a file that
// cannot be read or holds no certificate is a usage error before anything
// starts.
func TestEgressCAFlag(t *testing.T) {
	t.Parallel()
	f1, c1 := selfSignedPEM(t, "ca-one")
	f2, c2 := selfSignedPEM(t, "ca-two")
	var o workerOptions
	fs := pflag.NewFlagSet("worker", pflag.ContinueOnError)
	o.addFlags(fs)
	require.NoError(t, fs.Parse([]string{"--egress-ca", f1, "--egress-ca", f2}))
	_, err := o.check()
	require.NoError(t, err)
	roots := workerCmds{newTestApp(nil, nil).app}.workerConfig(&nats.Conn{}, o, nil, nil).EgressUpstreamRoots
	require.NotNil(t, roots)
	for _, c := range []*x509.Certificate{c1, c2} {
		_, err := c.Verify(x509.VerifyOptions{Roots: roots})
		require.NoError(t, err, c.Subject.CommonName)
	}

	o = workerOptions{}
	fs = pflag.NewFlagSet("worker", pflag.ContinueOnError)
	o.addFlags(fs)
	require.NoError(t, fs.Parse(nil))
	_, err = o.check()
	require.NoError(t, err)
	require.Nil(t, workerCmds{newTestApp(nil, nil).app}.workerConfig(&nats.Conn{}, o, nil, nil).EgressUpstreamRoots, "no flag: the system's roots")

	empty := filepath.Join(t.TempDir(), "empty.pem")
	require.NoError(t, os.WriteFile(empty, []byte("nothing\n"), 0o644))
	for _, args := range [][]string{
		{"worker", "--egress-ca", filepath.Join(t.TempDir(), "missing.pem")},
		{"up", "--egress-ca", empty},
	} {
		code, stdout, stderr := cli(t, "nats://127.0.0.1:1", args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, stderr)
		require.Empty(t, stdout)
		require.Contains(t, stderr, "--egress-ca", args)
		require.NotContains(t, stderr, "connect to NATS")
	}
}
