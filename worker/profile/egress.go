package profile

import (
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/jetcrew/jetcrew/coordination"
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

// ProxyEnv returns the environment that points a run's HTTP clients at its
// egress proxy: HTTPS_PROXY, HTTP_PROXY, ALL_PROXY and their lowercase forms,
// NO_PROXY for loopback, and NODE_USE_ENV_PROXY=1, without which Node's
// built-in fetch (Node 24 and later) ignores them.
func ProxyEnv() []string {
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

// ProxyTrustEnv points the run's TLS clients at the staged CA files:
// SSL_CERT_FILE (OpenSSL, Go), REQUESTS_CA_BUNDLE (Python requests),
// CURL_CA_BUNDLE (curl) name the bundle; NODE_EXTRA_CA_CERTS (Node) adds the
// CA to Node's own roots.
func ProxyTrustEnv() []string {
	bundle := coordination.ContainerRunDir + "/" + EgressCABundleName
	return []string{"SSL_CERT_FILE=" + bundle, "REQUESTS_CA_BUNDLE=" + bundle, "CURL_CA_BUNDLE=" + bundle,
		"NODE_EXTRA_CA_CERTS=" + coordination.ContainerRunDir + "/" + EgressCAName}
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
