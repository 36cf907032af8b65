package profile

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/egress/policy"
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
	EgressSocketPath = messages.ContainerRunDir + "/" + EgressSocketName
)

// ProxyEnv returns the environment pointing a run's HTTP clients at its proxy.
// That is HTTPS_PROXY, HTTP_PROXY, ALL_PROXY and their lowercase forms,
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

// ProxyTrustEnv returns the environment pointing TLS clients at the staged CAs.
// SSL_CERT_FILE (OpenSSL, Go), REQUESTS_CA_BUNDLE (Python requests),
// CURL_CA_BUNDLE (curl) name the bundle; NODE_EXTRA_CA_CERTS (Node) adds the
// CA to Node's own roots.
func ProxyTrustEnv() []string {
	bundle := messages.ContainerRunDir + "/" + EgressCABundleName
	return []string{"SSL_CERT_FILE=" + bundle, "REQUESTS_CA_BUNDLE=" + bundle, "CURL_CA_BUNDLE=" + bundle,
		"NODE_EXTRA_CA_CERTS=" + messages.ContainerRunDir + "/" + EgressCAName}
}

// forbiddenInjectHeaders may not be set by an injection: they frame the
// request or steer the proxy.
var forbiddenInjectHeaders = []string{"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer", "proxy-authorization", "proxy-connection"}

// EgressConfig is the profile facet saying what a run may reach, and how.
//
// The egress stage reads it to open the run's egress proxy (its policy,
// the headers it injects, the hosts an operator allows live, the pace of
// each injected key); a warm container takes all of it from its run.
type EgressConfig struct {
	// Egress lists what the profile's runs may reach, as "name:port"
	// ("*.example.com:443" for any name under example.com, "10.0.0.0/8:443"
	// or an address to list private addresses explicitly). Runs then have
	// no network but loopback, and their HTTP clients reach only these
	// through the worker's egress proxy (docs/profiles.md, docs/jail.md).
	Egress []string `toml:"egress" json:"egress,omitempty"`
	// EgressInject names secrets the egress proxy adds, as a header, to the
	// requests to one allowed host, instead of passing them into the
	// container (see EgressInject).
	EgressInject []EgressInject `toml:"egress_inject" json:"egress_inject,omitempty"`
	// EgressUnmeteredPaths lists the requests on egress_inject hosts that
	// pass without usage while the run has a cost or token budget, which
	// otherwise refuses every request whose usage the proxy cannot read
	// (another path, a background Responses request, a WebSocket
	// upgrade): "[METHOD ]PATH", PATH exact or ending "/*"
	// (policy.ParseUnmeteredPaths). The run's receipt names them. Empty
	// (default): none. Needs egress_inject.
	EgressUnmeteredPaths []string `toml:"egress_unmetered_paths" json:"egress_unmetered_paths,omitempty"`
	// EgressRate paces the runs' requests to each egress_inject host by
	// its key, across every worker using the key (EgressRate). Nil:
	// none. Needs egress_inject.
	EgressRate *EgressRate `toml:"egress_rate" json:"egress_rate,omitempty"`
	// EgressAsk lists hosts ("name:port", "*.suffix:port"; no addresses)
	// a run may reach only once an operator allows it, live: a connection
	// to one is held until an operator allows or denies it, for the run
	// or for the profile from now on (jetcrew egress pending|allow|deny),
	// or EgressAskTimeout passes (then it is refused). Empty: none.
	EgressAsk []string `toml:"egress_ask" json:"egress_ask,omitempty"`
	// EgressAskTimeout is how long a connection to an egress_ask host
	// waits for an operator, a Go duration; default DefaultEgressAskTimeout.
	EgressAskTimeout string `toml:"egress_ask_timeout" json:"egress_ask_timeout,omitempty"`

	policy     policy.Policy
	ask        policy.Policy
	askTimeout time.Duration
	unmetered  policy.UnmeteredPaths
}

// EgressInject is a header the egress proxy sets on every HTTPS request of
// a run to one host, its value read from the worker's environment: the key
// never enters the container. The proxy terminates TLS for that host with
// the installation's egress CA, which the container trusts.
type EgressInject struct {
	// Host is "name:port", one of the profile's Egress entries (not a
	// wildcard).
	Host string `toml:"host" json:"host"`
	// Header is the header's name, for example "x-api-key" or
	// "Authorization". A header of that name from the agent is replaced.
	Header string `toml:"header" json:"header"`
	// FromEnv names the worker's environment variable holding the value.
	FromEnv string `toml:"from_env" json:"from_env"`
	// Prefix is put before the value, for example "Bearer ".
	Prefix string `toml:"prefix" json:"prefix,omitempty"`
}

// DefaultEgressAskTimeout is how long a connection to an egress_ask host
// waits for an operator by default.
const DefaultEgressAskTimeout = 2 * time.Minute

// resolve parses the egress and egress_ask allowlists into their policies
// (policy.Parse; egress_ask names hosts only), the unmetered paths
// (which need egress_inject) and the ask timeout.
func (e *EgressConfig) resolve() error {
	if len(e.Egress) > 0 {
		pol, err := policy.Parse(e.Egress)
		if err != nil {
			return err
		}
		e.policy = pol
	}
	if len(e.EgressAsk) > 0 {
		pol, err := policy.Parse(e.EgressAsk)
		if err != nil {
			return fmt.Errorf("egress_ask: %w", err)
		}
		for _, r := range pol.Rules() {
			if r.Name == "" {
				return fmt.Errorf("egress_ask entry %s: an operator allows names, not addresses", r)
			}
		}
		e.ask = pol
	}
	if len(e.EgressUnmeteredPaths) > 0 {
		if len(e.EgressInject) == 0 {
			return errors.New("egress_unmetered_paths needs egress_inject: it lists requests on the hosts the proxy meters")
		}
		u, err := policy.ParseUnmeteredPaths(e.EgressUnmeteredPaths)
		if err != nil {
			return err
		}
		e.unmetered = u
	}
	var err error
	e.askTimeout, err = parseDuration("egress_ask_timeout", e.EgressAskTimeout, DefaultEgressAskTimeout)
	return err
}

// validate checks the egress keys, parsed: egress_rate, egress_inject
// (whose variables env_from_host must not also pass into the container),
// the ask timeout, and network none (the jail's network key) when there
// is an allowlist.
func (e EgressConfig) validate(network string, envFromHost []string) error {
	if err := e.validateRate(); err != nil {
		return err
	}
	if err := e.validateInject(envFromHost); err != nil {
		return err
	}
	if e.askTimeout < time.Second || e.askTimeout > time.Hour {
		return fmt.Errorf("egress_ask_timeout %s must be between 1s and 1h", e.askTimeout)
	}
	if e.HasEgress() && network != "none" {
		return fmt.Errorf("network %q with egress: a profile with an egress allowlist runs with network none, its only way out the egress proxy; drop network", network)
	}
	return nil
}

// validateInject checks the profile's egress_inject entries: each names an
// exact (not wildcard) egress entry, a header that does not frame the
// request, and a variable that is not also passed into the container
// (envFromHost).
func (e EgressConfig) validateInject(envFromHost []string) error {
	for _, in := range e.EgressInject {
		host, _, err := net.SplitHostPort(in.Host)
		if err != nil || strings.HasPrefix(host, "*") || !slices.ContainsFunc(e.Egress, func(s string) bool { return strings.EqualFold(s, in.Host) }) {
			return fmt.Errorf("egress_inject host %q must be one of the profile's egress entries, a name:port without wildcard", in.Host)
		}
		if !validHeaderName(in.Header) || slices.Contains(forbiddenInjectHeaders, strings.ToLower(in.Header)) {
			return fmt.Errorf("egress_inject header %q is not a header the proxy may set", in.Header)
		}
		if !messages.ValidEnvName(in.FromEnv) {
			return fmt.Errorf("egress_inject from_env %q is not a valid variable name", in.FromEnv)
		}
		if slices.Contains(envFromHost, in.FromEnv) {
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
func (e EgressConfig) validateRate() error {
	r := e.EgressRate
	switch {
	case r == nil:
		return nil
	case r.RequestsPerMinute < 0 || r.TokensPerMinute < 0:
		return errors.New("egress_rate: requests_per_minute and tokens_per_minute must not be negative")
	case r.RequestsPerMinute == 0 && r.TokensPerMinute == 0:
		return errors.New("egress_rate: set requests_per_minute, tokens_per_minute or both")
	case len(e.EgressInject) == 0:
		return errors.New("egress_rate needs egress_inject: it paces the requests made with an injected key")
	}
	return nil
}

// EgressPolicy returns the parsed egress allowlist (the egress key).
// It is the zero Policy for a profile without one.
func (e EgressConfig) EgressPolicy() policy.Policy { return e.policy }

// HasEgress reports whether the profile has an egress allowlist (or ask list).
// Its runs then have network none and reach only those hosts, through
// their egress proxy.
func (e EgressConfig) HasEgress() bool { return len(e.Egress) > 0 || len(e.EgressAsk) > 0 }

// EgressUnmetered returns egress_unmetered_paths, parsed.
func (e EgressConfig) EgressUnmetered() policy.UnmeteredPaths { return e.unmetered }

// EgressAskPolicy returns the hosts of egress_ask, parsed.
func (e EgressConfig) EgressAskPolicy() policy.Policy { return e.ask }

// EgressAskTimeoutDuration returns how long a connection to an egress_ask
// host waits for an operator.
func (e EgressConfig) EgressAskTimeoutDuration() time.Duration { return e.askTimeout }

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
