package profile

import (
	"fmt"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
)

// AdmissionConfig is the profile facet deciding which requests may run.
//
// The runner reads it when a request is delivered, before anything is staged
// (Profile.CheckRequest, VerifySignedRequest); no run's container depends on
// it (warm.Irrelevant).
type AdmissionConfig struct {
	// SignedBy lists NKey user public keys ("U…"); when set, a request for
	// the profile runs only when signed by one of them (Jetcrew-Signer and
	// Jetcrew-Signature headers, see messages.HeaderSignature); otherwise it
	// fails with the reason and a dead letter, before anything runs.
	SignedBy []string `toml:"signed_by" json:"signed_by,omitempty"`
	// RequestEnv names the variables a run request's env may set for this
	// profile: exact names, or prefixes ending in '*' ("APP_*"; "*" alone
	// accepts any name). Default: empty, a request carrying env is refused.
	// Loader, runtime, proxy and worker variables (DeniedRequestEnv) are
	// refused even when listed. The built-in shell profile has ["*"].
	RequestEnv []string `toml:"request_env" json:"request_env,omitempty"`
}

// validate checks signed_by's keys and request_env's entries: each a
// variable name or a prefix ending in '*', and no name a request may never
// set (DeniedRequestEnv).
func (a AdmissionConfig) validate() error {
	for _, name := range a.RequestEnv {
		pat := strings.TrimSuffix(name, "*")
		if pat != "" && !messages.ValidEnvName(pat) {
			return fmt.Errorf("request_env %q is neither a variable name nor a prefix ending in '*'", name)
		}
		if pat == name && DeniedRequestEnv(name) {
			return fmt.Errorf("request_env %q is a loader, runtime, proxy or worker variable, which a request may never set", name)
		}
	}
	return checkSignedBy(a.SignedBy)
}

// allowsRequestEnv reports whether the profile accepts variable name from a
// request: listed in request_env, exactly or by a prefix ending in '*', and
// not denied (DeniedRequestEnv).
func (a AdmissionConfig) allowsRequestEnv(name string) bool {
	if DeniedRequestEnv(name) {
		return false
	}
	for _, pat := range a.RequestEnv {
		if pre, ok := strings.CutSuffix(pat, "*"); ok && strings.HasPrefix(name, pre) || pat == name {
			return true
		}
	}
	return false
}
