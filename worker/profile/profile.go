package profile

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"time"

	"github.com/jetcrew/jetcrew/messages"
)

// Profile is an operator-defined recipe for running a request: the image,
// the command, the user, the limits and the network. A run request only
// names a profile; it can never choose any of these.
//
// Profiles are read from a TOML file (see LoadProfiles), one table per
// profile under [profiles.<name>]; docs/profiles.md documents each key.
// The keys are flat in the file; in Go they are grouped in facets, one
// embedded struct per concern, each resolving (defaults, parsed values)
// and validating its own keys in its own file: the stage that reads a
// concern reads its facet. TOML and JSON flatten embedded structs, and
// MarshalJSON keeps the JSON encoding's key order (jsonKeys).
type Profile struct {
	// Name is the profile's name (the TOML table key).
	Name string `toml:"-" json:"name"`

	// JailConfig is the container a run gets: image, user, limits, network.
	JailConfig
	// AgentConfig is what runs in it: backend, argv, environment.
	AgentConfig
	// WatchConfig is the worker's watch of a run: timeouts, output, retries.
	WatchConfig
	// CoordinationConfig is the run's MCP coordination bridge and its deadline.
	CoordinationConfig
	// EgressConfig is what a run may reach, through its egress proxy.
	EgressConfig
	// BudgetConfig is the model budgets the egress proxy enforces.
	BudgetConfig
	// WorkspaceConfig is a run's workspace: size, git sources, earlier runs.
	WorkspaceConfig
	// WarmConfig is how many warm containers each worker keeps.
	WarmConfig
	// AdmissionConfig is who may run the profile and which request env.
	AdmissionConfig
}

// ShellProfile returns the built-in "shell" profile: /bin/sh -c <prompt> in
// SandboxImage, network none, default limits.
func ShellProfile() Profile {
	p := Profile{
		Name:        "shell",
		JailConfig:  JailConfig{Image: SandboxImage},
		AgentConfig: AgentConfig{Backend: BackendCommand, Command: []string{"/bin/sh", "-c", "{prompt}"}},
		// Any variable but the denied ones: the script can set them itself.
		AdmissionConfig: AdmissionConfig{RequestEnv: []string{"*"}},
		// A shell script is not an MCP client: it may use the bridge, but
		// need not.
		CoordinationConfig: CoordinationConfig{RequireBridge: new(bool)},
	}
	p, _ = p.Resolve()
	return p
}

// Resolve returns p with its defaults applied and values parsed, then
// validated. Each facet applies its defaults and parses its durations and
// policies: the value runs read, never defaulted again. ParseProfiles
// resolves every profile it loads; a Profile built in code must be resolved
// before a worker uses it. The error names the key at fault.
func (p Profile) Resolve() (Profile, error) {
	if err := p.resolve(); err != nil {
		return p, err
	}
	return p, p.validate()
}

// resolve applies each facet's defaults and parses its values, in the
// order their defaults depend on each other (the workspace's size on the
// jail's memory, the stall timeout on the backend, ...).
func (p *Profile) resolve() error {
	p.JailConfig.resolve()
	p.AgentConfig.resolve()
	if err := p.WorkspaceConfig.resolve(p.JailConfig); err != nil {
		return err
	}
	if err := p.WatchConfig.resolve(p.Backend); err != nil {
		return err
	}
	if err := p.CoordinationConfig.resolve(); err != nil {
		return err
	}
	if err := p.EgressConfig.resolve(); err != nil {
		return err
	}
	return p.BudgetConfig.resolve()
}

// validate checks a resolved profile, facet by facet; a facet whose rule
// involves another facet's key is handed that key.
func (p Profile) validate() error {
	if err := messages.ValidateToken("profile name", p.Name); err != nil {
		return err
	}
	for _, err := range []error{
		p.JailConfig.validate(),
		p.AgentConfig.validate(),
		p.WatchConfig.validate(),
		p.CoordinationConfig.validate(),
		p.EgressConfig.validate(p.Network, p.EnvFromHost),
		p.BudgetConfig.validate(len(p.EgressInject) > 0),
		p.WorkspaceConfig.validate(),
		p.WarmConfig.validate(p.CoordinationOn()),
		p.AdmissionConfig.validate(),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// parseDuration parses the Go duration s of key; def when s is empty.
func parseDuration(key, s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", key, err)
	}
	return d, nil
}

// Digest returns the hex SHA-256 of p's effective configuration. That is
// of its JSON encoding (MarshalJSON), every default applied: a receipt's
// ProfileDigest. It costs a JSON encoding; the worker computes it once per
// profile.
func (p Profile) Digest() string {
	effective, _ := p.MarshalJSON() // a Profile always marshals; json.Marshal(p) gives the same bytes
	sum := sha256.Sum256(effective)
	return hex.EncodeToString(sum[:])
}

// Profiles is a validated set of profiles by name.
type Profiles map[string]Profile

// DefaultProfiles returns the built-in set: just ShellProfile.
func DefaultProfiles() Profiles {
	return Profiles{"shell": ShellProfile()}
}

// Names returns the profile names, sorted.
func (ps Profiles) Names() []string {
	names := make([]string, 0, len(ps))
	for n := range ps {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
