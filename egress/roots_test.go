package egress

import (
	"crypto/x509"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// writePEM writes cert to a PEM file in a temporary directory and returns
// its path.
func writePEM(t *testing.T, cert *x509.Certificate) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), 0o644))
	return path
}

// A host whose certificate the worker does not trust becomes trusted when
// its CA is given (--egress-ca): the roots are the system's plus the
// file's, and the model request goes through.
func TestUpstreamRootsTrustAHost(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"type":"message","model":"claude-test","usage":{"input_tokens":1,"output_tokens":1}}`)
	}))
	t.Cleanup(srv.Close)
	p := atoi(t, port(t, srv.URL))

	roots, err := UpstreamRoots()
	require.NoError(t, err)
	require.Nil(t, roots, "no file: the system's roots (Config.UpstreamRoots nil)")
	resp, body := upstreamSetup(t, p, roots).postMessages(t)
	require.Equal(t, http.StatusBadGateway, resp.StatusCode, body)
	require.Contains(t, body, "upstream certificate not trusted")

	roots, err = UpstreamRoots(writePEM(t, srv.Certificate()))
	require.NoError(t, err)
	resp, body = upstreamSetup(t, p, roots).postMessages(t)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, body, `"model":"claude-test"`)
}

// A CA file that cannot be read, or holds no certificate, is an error
// naming it.
func TestUpstreamRootsBadFile(t *testing.T) {
	t.Parallel()
	_, err := UpstreamRoots(filepath.Join(t.TempDir(), "missing.pem"))
	require.ErrorContains(t, err, "missing.pem")
	empty := filepath.Join(t.TempDir(), "empty.pem")
	require.NoError(t, os.WriteFile(empty, []byte("not a certificate\n"), 0o644))
	_, err = UpstreamRoots(empty)
	require.ErrorContains(t, err, "empty.pem")
	require.True(t, strings.Contains(err.Error(), "no PEM certificate"), err.Error())
}
