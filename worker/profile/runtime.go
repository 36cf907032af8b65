package profile

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrOCIRuntimeMissing is wrapped by the error Start returns when a profile
// names an OCI runtime the engine does not offer.
var ErrOCIRuntimeMissing = errors.New("OCI runtime not offered by the engine")

// ErrOCIRuntimeUnusable is wrapped by the error Start returns when a profile
// names an OCI runtime the engine offers but that cannot start a container
// (crun on a host whose cgroups are hybrid, for one).
var ErrOCIRuntimeUnusable = errors.New("OCI runtime cannot start containers")

// validRuntimeName reports whether s can name an OCI runtime in a profile:
// non-empty, at most 64 bytes of letters, digits, '.', '-' and '_' (the
// names daemon.json registers, such as "runsc", "io.containerd.runc.v2").
func validRuntimeName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// OCIRuntimes returns each OCI runtime the profiles name, with those profiles.
// The engine's default, "", is left out; profiles are sorted by name.
func (ps Profiles) OCIRuntimes() map[string][]Profile {
	out := map[string][]Profile{}
	for _, name := range ps.Names() {
		if p := ps[name]; p.Runtime != "" {
			out[p.Runtime] = append(out[p.Runtime], p)
		}
	}
	return out
}

// CheckOCIRuntimes checks that the engine offers every runtime a profile names.
// It returns nil when every profile's runtime is empty (the engine's
// default) or one of available; otherwise an error wrapping
// ErrOCIRuntimeMissing that names each such profile, its runtime and the
// runtimes available.
func (ps Profiles) CheckOCIRuntimes(available []string) error {
	var missing []string
	for _, name := range ps.Names() {
		rt := ps[name].Runtime
		if rt != "" && !slices.Contains(available, rt) {
			missing = append(missing, fmt.Sprintf("profile %q names runtime %q", name, rt))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s; the engine offers: %s (register the runtime in the daemon's \"runtimes\", docs/jail.md)",
		ErrOCIRuntimeMissing, strings.Join(missing, "; "), strings.Join(available, ", "))
}
