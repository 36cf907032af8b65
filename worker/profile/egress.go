package profile

import (
	"errors"
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

// EgressRate is a rate per injected key that every worker paces the
// requests made with the key by: a token bucket of requests and of
// tokens, each refilled continuously at its rate per minute and holding at
// most one minute's worth, kept in the jetcrew-budgets bucket (the key
// "rate.<first 12 bytes of the SHA-256 of the injected header's value,
// hex>"; never the key). A
// request takes one request and its tokens (its input estimated from its
// body, plus its output cap); one the bucket cannot give within the
// worker's bound (30 seconds) is answered with the provider's own 429 and
// retry-after, which the agent's client waits out and retries: the fleet
// slows down instead of collecting the provider's 429s.
type EgressRate struct {
	// RequestsPerMinute is the key's request rate; 0: none.
	RequestsPerMinute int64 `toml:"requests_per_minute" json:"requests_per_minute,omitempty"`
	// TokensPerMinute is the key's token rate (input and output
	// together, as the requests' estimates count them); 0: none.
	TokensPerMinute int64 `toml:"tokens_per_minute" json:"tokens_per_minute,omitempty"`
}

// validateRate checks egress_rate: rates not negative, one set, on a
// profile whose proxy meters a host (egress_inject).
func (p Profile) validateRate() error {
	r := p.EgressRate
	switch {
	case r == nil:
		return nil
	case r.RequestsPerMinute < 0 || r.TokensPerMinute < 0:
		return errors.New("egress_rate: requests_per_minute and tokens_per_minute must not be negative")
	case r.RequestsPerMinute == 0 && r.TokensPerMinute == 0:
		return errors.New("egress_rate: set requests_per_minute, tokens_per_minute or both")
	case len(p.EgressInject) == 0:
		return errors.New("egress_rate needs egress_inject: it paces the requests made with an injected key")
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
