package profile

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
)

// profileFile is the TOML document LoadProfiles reads.
type profileFile struct {
	Profiles map[string]Profile `toml:"profiles"`
}

// LoadProfiles reads the TOML profile file at path, resolving every profile.
// It returns the built-in profiles overlaid with the file's (a profile of
// the same name replaces the built-in one), or an error naming the file, the
// profile and the key for unknown keys, bad values or a profile that fails
// validation.
func LoadProfiles(path string) (Profiles, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("profiles: %w", err)
	}
	return ParseProfiles(path, data)
}

// ParseProfiles is LoadProfiles on data already read; name is used in
// errors.
func ParseProfiles(name string, data []byte) (Profiles, error) {
	var f profileFile
	md, err := toml.Decode(string(data), &f)
	if err != nil {
		return nil, fmt.Errorf("profiles %s: %w", name, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		sort.Strings(keys)
		return nil, fmt.Errorf("profiles %s: unknown keys: %s", name, strings.Join(keys, ", "))
	}
	if err := checkExactKeys(md); err != nil {
		return nil, fmt.Errorf("profiles %s: %w", name, err)
	}
	out := DefaultProfiles()
	for n, p := range f.Profiles {
		p.Name = n
		p, err := p.Resolve()
		if err != nil {
			return nil, fmt.Errorf("profiles %s: profile %q: %w", name, n, err)
		}
		out[n] = p
	}
	return out, nil
}

// checkExactKeys refuses a key of the profile file that is not exactly one of
// the documented names: the TOML decoder matches "Image" or "IMAGE" to
// "image" (and keeps one of two such keys silently).
func checkExactKeys(md toml.MetaData) error {
	known := profileKeys()
	for _, k := range md.Keys() {
		switch {
		case len(k) >= 1 && k[0] != "profiles":
			return fmt.Errorf("key %q is not %q: keys are matched exactly, case included", k[0], "profiles")
		case len(k) >= 3 && !known[k[2]]:
			return fmt.Errorf("profile %q: key %q is not a profile key (keys are matched exactly, case included)", k[1], k[2])
		}
	}
	return nil
}
